"""User-facing errors: one line that names the input and the fix, exit code 2, no traceback."""

from __future__ import annotations

import contextlib
import csv
import gzip
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError


class CodaError(Exception):
    """An error caused by the user's input (file, flag, config), not by a bug in Coda.

    The CLI prints ``error: <message>`` and exits with code 2; the message must name the
    offending input and say how to fix it.
    """

    exit_code = 2


def invalid(source: str, err: ValidationError, fix: str = "", show_input: bool = False, at: str = "") -> CodaError:
    """A validation error as one line: ``source: field.path: what is wrong[ (got X)][; fix]``
    (``at``: the path of the validated part within the whole input)."""
    first = err.errors()[0]
    # a key with a line break or other unprintable character is shown as its repr, so the message stays one line
    loc = ".".join(s if (s := str(x)).isprintable() else repr(x) for x in (*([at] if at else []), *first["loc"])) or "(top level)"
    msg = first["msg"].removeprefix("Value error, ")
    got = f" (got {first.get('input')!r})" if show_input and first["type"] != "value_error" else ""
    return CodaError(f"{source}: {loc}: {msg}{got}{'; ' + fix if fix else ''}")


@contextlib.contextmanager
def reading(path: str | Path, what: str) -> Iterator[None]:
    """Whatever goes wrong reading ``path`` (the ``what`` it should be: "workload", "config",
    ...) inside this block, as one line naming the file and the fix: bytes that are not UTF-8
    text, a name ending in ``.gz`` on something that is not gzip, a gzip stream cut short, a
    directory, a CSV that the csv module cannot split, a path that cannot be read."""
    try:
        yield
    except UnicodeDecodeError as err:
        raise CodaError(f"{what} {path}: not UTF-8 text (byte {err.start} is {err.object[err.start:err.start + 1]!r}); "
                        f"pass a text {what} file") from None
    except (gzip.BadGzipFile, zlib.error) as err:
        raise CodaError(f"{what} {path}: not a valid gzip file ({err}); pass the file uncompressed, or under a name without .gz") from None
    except csv.Error as err:
        raise CodaError(f"{what} {path}: not a readable CSV ({err}); pass a comma-separated {what} file") from None
    except EOFError:
        raise CodaError(f"{what} {path}: the gzip data ends early (a truncated file?); pass the complete file") from None
    except IsADirectoryError:
        raise CodaError(f"{what} {path}: is a directory; pass a {what} file") from None
    except FileNotFoundError:
        raise CodaError(f"{what} {path}: no such file; check the path") from None
    except OSError as err:
        raise CodaError(f"{what} {path}: cannot be read ({err.strerror or err}); check the path and its permissions") from None


#: the largest JSON document (a cost profile, a model's config.json) read whole; the largest shipped
#: profile is under 1 MiB (assumed: room for a profile with a million measured samples inline)
MAX_DOCUMENT_BYTES = 64 * 2**20


def read_document(path: Path, what: str, limit_bytes: int = MAX_DOCUMENT_BYTES) -> str:
    """A text file read whole, refused in one line before it is read when it is larger than
    ``limit_bytes`` (so a huge file given by mistake costs nothing), with ``reading``'s errors."""
    with reading(path, what):
        size = path.stat().st_size
        if size > limit_bytes:
            raise CodaError(f"{what} {path}: {size:,} bytes, more than any {what} ({limit_bytes:,}); pass the right file")
        return path.read_text()


# The extra (pyproject.toml) that installs each optional dependency: a command that needs one the
# install left out says what to install, in one line, instead of a traceback.
EXTRA_OF = {
    "typer": "all",
    "rich": "all",
    "scipy": "all",
    "numba": "sim",
    "starlette": "gateway",
    "uvicorn": "gateway",
    "httptools": "gateway",
    "uvloop": "gateway",
    "httpx": "gateway",
    "httpx_sse": "gateway",
    "prometheus_client": "gateway",
    "zmq": "gateway",
    "tokenizers": "gateway",
    "redis": "gateway",
    "matplotlib": "plots",
    "torch": "measure",
    "ray": "ray",
}


def missing_dependency(err: ModuleNotFoundError) -> CodaError | None:
    """The error to show for an optional dependency that is not installed; None for any other
    missing module, which is a bug to report as it is."""
    top = (err.name or "").partition(".")[0]
    extra = EXTRA_OF.get(top)
    return None if extra is None else CodaError(f"{top} is not installed, and this command needs it: pip install 'coda[{extra}]'")
