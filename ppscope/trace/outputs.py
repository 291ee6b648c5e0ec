"""Where a command may write, and how: the one check every output path goes through, and atomic writes.

Every option that names an output (`analyze --html`, `export --out`, `simulate --out`, `run --out`, ...) goes
through `check_output` before the command does any work. It refuses, in one line:

- `-`: ppscope does not write results to standard output (its stdout carries the report or the `wrote` line,
  an nsys SQLite file cannot be streamed, and a stream cut short cannot be taken back); `./-` names a file `-`;
- a path inside a run directory (the input run, or any other) or inside a trace the command reads;
- an existing output, unless `--force` (a new run directory is never replaced, with or without it);
- a folder that does not exist (runs excepted: `runs/` is made for them), or one that cannot be written.

Files are then written by `atomic_file` / `atomic_folder`: into a temporary name beside the output that
becomes the output in one rename, so a failed write leaves nothing behind; with the umask's permissions, as
any other file. Errors of the file system become `InvalidConfigError`s naming the path.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal

from ppscope.errors import ErrorCode, InvalidConfigError, RunExistsError
from ppscope.trace.store import check_new_run_dir, check_outside_runs

__all__ = ["OutputKind", "atomic_file", "atomic_folder", "check_output"]

OutputKind = Literal["file", "folder", "run", "runs"]
"""file: one file; folder: a folder of files made whole (NVTXT); run: a new run directory; runs: a folder
new run directories go into (it may exist)."""

PathLike = str | os.PathLike[str]


def check_output(
    path: PathLike,
    *,
    option: str = "--out",
    kind: OutputKind = "file",
    inputs: Sequence[PathLike] = (),
    force: bool = False,
    replaceable: str = "*",
) -> Path:
    """Refuse `path` as the output of `option` unless writing it is safe (see the module's list); returns
    it as a Path. `inputs`: the traces the command reads (files or directories). `replaceable`: for a
    folder, the glob of the only files `force` may replace (anything else in it is refused even so).

    Only the string `-`, as typed, is refused as standard output: pathlib reads `./-` as `-`, so a Path
    always names a file."""
    if isinstance(path, str) and path == "-":
        raise InvalidConfigError(
            ErrorCode.OUTPUT_NOT_WRITABLE,
            f"{option} -: ppscope writes no results to standard output (it carries the report); give a path "
            "(./- for one named '-')",
        )
    if not str(path).strip():
        raise InvalidConfigError(ErrorCode.OUTPUT_PATH_EMPTY, f"{option} is empty: give a path")
    out = Path(path)
    _check_outside_inputs(out, option, inputs)
    if kind == "run":  # a new run directory: `check_new_run_dir` refuses one inside a run, and a run itself
        _check_run_place(out, option, new=True)
        return out
    check_outside_runs(out, f"{option} {out}")
    if kind == "runs":
        _check_run_place(out, option, new=False)
        return out
    _check_folder(out, option)
    if kind == "file":
        _check_file(out, option, force)
    else:
        _check_folder_output(out, option, force, replaceable)
    return out


def _check_outside_inputs(out: Path, option: str, inputs: Sequence[PathLike]) -> None:
    target = out.resolve()
    for given in inputs:
        source = Path(given).resolve()
        if target == source or source in target.parents:
            raise InvalidConfigError(
                ErrorCode.OUTPUT_INTO_INPUT,
                f"{option} {out} would write into the input {given}: give a path outside it",
            )


def _check_run_place(out: Path, option: str, *, new: bool) -> None:
    """A run directory (`new`) must be new or empty; a folder of runs may exist. Missing parents are made
    when the run starts (`ppscope.trace.store.create_run`, which also says when one of them is a file)."""
    if new:
        check_new_run_dir(out)
    elif out.exists() and not out.is_dir():
        raise RunExistsError(ErrorCode.OUTPUT_WRONG_KIND, f"{out} exists and is not a folder: choose another {option}")


def _check_folder(out: Path, option: str) -> None:
    """The folder an output goes into must exist and be writable: ppscope creates no folders but runs'."""
    folder = out.parent
    if not folder.exists():
        raise InvalidConfigError(
            ErrorCode.OUTPUT_NOT_WRITABLE,
            f"{option}: cannot write {out}: folder {folder} does not exist: create it first",
        )
    if not folder.is_dir():
        raise InvalidConfigError(
            ErrorCode.OUTPUT_NOT_WRITABLE, f"{option}: cannot write {out}: {folder} is a file, not a folder"
        )
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InvalidConfigError(
            ErrorCode.OUTPUT_NOT_WRITABLE, f"{option}: cannot write {out}: folder {folder} is not writable"
        )


def _check_file(out: Path, option: str, force: bool) -> None:
    if out.is_dir():
        raise RunExistsError(ErrorCode.OUTPUT_WRONG_KIND, f"{out} is a folder: give a file name for {option}")
    if (out.exists() or out.is_symlink()) and not force:
        raise _exists(out, option)


def _exists(out: Path, option: str) -> RunExistsError:
    return RunExistsError(
        ErrorCode.RUN_EXISTS, f"{out} already exists: choose another {option} or pass --force to replace it"
    )


def _check_folder_output(out: Path, option: str, force: bool, replaceable: str) -> None:
    if out.exists() and not out.is_dir():
        raise RunExistsError(
            ErrorCode.OUTPUT_WRONG_KIND, f"{out} is a file: {option} names a folder here (one file per rank)"
        )
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not force:
        raise RunExistsError(
            ErrorCode.RUN_EXISTS, f"{out} already holds files: choose another {option} or pass --force to replace it"
        )
    others = sorted(p.name for p in out.iterdir() if not (p.is_file() and p.match(replaceable)))
    if others:
        raise RunExistsError(
            ErrorCode.OUTPUT_HOLDS_OTHER_FILES,
            f"{out} holds {others[0]}{f' and {len(others) - 1} more' if len(others) > 1 else ''}, not only "
            f"{replaceable} files: --force replaces an earlier export only; choose another {option}",
        )


def _cannot_write(option: str, out: Path, exc: OSError) -> InvalidConfigError:
    reason = exc.strerror or str(exc)
    return InvalidConfigError(ErrorCode.OUTPUT_NOT_WRITABLE, f"{option}: cannot write {out}: {reason}")


def _temp_name(out: Path) -> Path:
    return out.with_name(f".{out.name[:200]}.{secrets.token_hex(4)}.tmp")


@contextlib.contextmanager
def atomic_file(path: PathLike, *, option: str = "--out", force: bool = False) -> Iterator[Path]:
    """Check `path` (`check_output`), then yield a new empty file beside it; when the block ends without
    an error that file becomes `path` in one rename (without `force`, only if `path` is still free)."""
    out = check_output(path, option=option, force=force)
    tmp = _temp_name(out)
    try:
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))  # the umask decides, as for any file
    except OSError as exc:
        raise _cannot_write(option, out, exc) from None
    try:
        yield tmp
        _publish(tmp, out, option, force)
    except OSError as exc:
        raise _cannot_write(option, out, exc) from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _publish(tmp: Path, out: Path, option: str, force: bool) -> None:
    if force:
        os.replace(tmp, out)
        return
    try:
        os.link(tmp, out)  # fails if `out` appeared meanwhile: the test and the creation are one step
    except FileExistsError:
        raise _exists(out, option) from None
    except OSError:  # a file system without hard links
        if out.exists():
            raise _exists(out, option) from None
        os.replace(tmp, out)


@contextlib.contextmanager
def atomic_folder(
    path: PathLike, *, option: str = "--out", force: bool = False, replaceable: str = "*"
) -> Iterator[Path]:
    """`atomic_file` for a folder of files: yield a new empty folder beside `path`; on success it takes
    `path`'s place (an earlier export there, `replaceable` files only, is removed once the new one is in)."""
    out = check_output(path, option=option, kind="folder", force=force, replaceable=replaceable)
    tmp = _temp_name(out)
    try:
        os.mkdir(tmp, 0o777)
    except OSError as exc:
        raise _cannot_write(option, out, exc) from None
    old = _temp_name(out)
    try:
        yield tmp
        if out.is_dir():
            os.rename(out, old)
        os.rename(tmp, out)
    except OSError as exc:
        raise _cannot_write(option, out, exc) from None
    finally:
        if old.exists() and not out.exists():  # the new folder did not take its place: the old one goes back
            with contextlib.suppress(OSError):
                os.rename(old, out)
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
