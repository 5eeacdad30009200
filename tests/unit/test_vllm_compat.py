"""The vLLM versions the scheduler accepts: the tested minor release (patch, local and dev builds of
it included); anything else fails in one line that names the tested range."""

from __future__ import annotations

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from coda.errors import CodaError
from coda.integrations.vllm.compat import RANGE, check_version


@pytest.mark.parametrize("version", ["0.32.0", "0.32.0+cpu", "0.32.4", "0.32.1.dev12+g0181ea31"])
def test_the_tested_minor_release_is_accepted(version):
    try:
        check_version(version)
    except CodaError as err:
        pytest.fail(f"vLLM {version} lies in the tested minor release but was refused: {err}")
    # and the range the refusal message names covers it, so the message never contradicts the check
    assert SpecifierSet(RANGE).contains(Version(version), prereleases=True)


@pytest.mark.parametrize("version", ["0.31.9", "0.32.0rc1", "0.33.0", "0.33.0.dev3", "1.0.0", "not-a-version"])
def test_any_other_version_fails_in_one_line_naming_the_tested_range(version):
    with pytest.raises(CodaError) as err:
        check_version(version)
    msg = str(err.value)
    assert "\n" not in msg and RANGE in msg and version in msg and "--scheduler-cls" in msg
