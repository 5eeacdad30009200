import gzip
import json

import pytest

from coda.errors import CodaError
from coda.workload.schema import Workload, read_workload, session_prompts, write_workload


def _write(tmp_path, lines, name="w.jsonl"):
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return p


GOOD = json.dumps({"session_id": "s", "start_s": 0, "rounds": [{"new_input_tokens": 10, "output_tokens": 5}]})


def test_round_trip_preserves_sessions(tmp_path, tiny_workload):
    for name in ("w.jsonl", "w.jsonl.gz"):
        path = tmp_path / name
        write_workload(tiny_workload, path)
        back = read_workload(path)
        assert [s.session_id for s in back.sessions] == ["a", "b", "c"]
        assert back.sessions == tiny_workload.sessions
        assert back.meta == tiny_workload.meta
    with gzip.open(tmp_path / "w.jsonl.gz", "rt") as fh:
        assert json.loads(fh.readline())["coda_workload"] == 1


def test_prompts_follow_the_growing_context(tiny_workload):
    a = tiny_workload.sessions[0]
    # round 0: group prefix 1024 + 2000 new; then the whole previous context is reused
    assert list(session_prompts(a)) == [(1024, 3024), (3074, 3374), (3414, 3614)]


@pytest.mark.parametrize(
    "line, where",
    [
        ('{"session_id": "s", "start_s": 0, "rounds": [{"new_input_tokens": 10, "output_tokens": 0}]}', "rounds[0].output_tokens"),
        ('{"session_id": "s", "start_s": -1, "rounds": [{"new_input_tokens": 10, "output_tokens": 2}]}', "start_s"),
        ('{"session_id": "s", "start_s": 0, "rounds": [{"new_input_tokens": "x", "output_tokens": 2}]}', "rounds[0].new_input_tokens"),
        ('{"session_id": "s", "start_s": 0, "rounds": [{"new_input_tokens": 1, "output_tokens": 2, "kind": "bot"}]}', "rounds[0].kind"),
        ('{"session_id": "s", "start_s": 0, "rounds": []}', "session"),
        ('{"session_id": "s", "start_s": 0, "rounds": [{"new_input_tokens": 1, "output_tokens": 2, "typo": 1}]}', "rounds[0]"),
        ('{"session_id": "s", "start_s": 0, "rounds": [{"new_input_tokens": 1, "output_tokens": 2}', "json"),
    ],
)
def test_bad_line_names_file_line_and_field(tmp_path, line, where):
    path = _write(tmp_path, [GOOD.replace('"s"', '"ok"'), line])
    with pytest.raises(CodaError) as err:
        read_workload(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}:2: {where}"), msg


def test_prefix_longer_than_context_is_rejected(tmp_path):
    line = json.dumps({"session_id": "s", "start_s": 0, "rounds": [
        {"new_input_tokens": 10, "output_tokens": 5}, {"new_input_tokens": 1, "output_tokens": 1, "prefix_tokens": 16}]})
    with pytest.raises(CodaError, match=r"w.jsonl:1: session: rounds\[1\].prefix_tokens=16 exceeds the previous context of 15"):
        read_workload(_write(tmp_path, [line]))


def test_group_prefix_requires_a_group(tmp_path):
    line = json.dumps({"session_id": "s", "start_s": 0, "rounds": [{"new_input_tokens": 10, "output_tokens": 5, "prefix_tokens": 100}]})
    with pytest.raises(CodaError, match="needs prefix_group"):
        read_workload(_write(tmp_path, [line]))


def test_duplicate_session_and_empty_file(tmp_path):
    with pytest.raises(CodaError, match=r":2: session_id: duplicate id 's'"):
        read_workload(_write(tmp_path, [GOOD, GOOD]))
    with pytest.raises(CodaError, match="holds no sessions"):
        read_workload(_write(tmp_path, [""]))


def test_block_hashes_must_cover_the_prompt(tmp_path):
    header = json.dumps({"coda_workload": 1, "block_tokens": 512})
    ok = json.dumps({"session_id": "s", "start_s": 0, "rounds": [{"new_input_tokens": 1000, "output_tokens": 5, "block_hashes": [1, 2]}]})
    assert read_workload(_write(tmp_path, [header, ok])).block_tokens == 512
    bad = ok.replace("[1, 2]", "[1]")
    with pytest.raises(CodaError, match=r"rounds\[0\].block_hashes: has 1 hashes, a 1000-token prompt needs 2 blocks of 512"):
        read_workload(_write(tmp_path, [header, bad]))
    with pytest.raises(CodaError, match="no block_tokens"):
        read_workload(_write(tmp_path, [ok]))


def test_unsupported_version_and_missing_file(tmp_path):
    with pytest.raises(CodaError, match="version 9 is not supported"):
        read_workload(_write(tmp_path, ['{"coda_workload": 9}', GOOD]))
    with pytest.raises(CodaError, match="no such workload file"):
        read_workload(tmp_path / "missing.jsonl")


def test_workload_counts_requests(tiny_workload):
    assert tiny_workload.num_requests == 6
    assert isinstance(tiny_workload, Workload)
