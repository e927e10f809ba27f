"""The ``accel`` command line.

Each subcommand lives in its subpackage's ``cli`` module, which exposes ``register(subparsers)``; it adds its parser
and sets ``func`` (a callable taking the parsed ``argparse.Namespace`` and returning an exit code). Modules are imported
only to build the parser, and a subpackage whose optional dependencies are missing simply has no subcommand.

One error boundary (``run_command``) wraps every subcommand: an expected failure (an ``AccelError``, an ``OSError``
such as a missing or read-only path, a ``ValueError`` from a check) prints one line ``accel CMD: error: ...`` and
exits with status 2, the status argparse gives a bad command line. Ctrl-C and SIGTERM stop a command the same way
(status 130 / 143, after its cleanup ran). Anything else is a bug: one line asking for a report, status 70. With
``--debug`` (anywhere on the command line) or ``ACCEL_DEBUG=1`` the traceback is printed as well.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from accel.errors import AccelError

# subpackage cli modules, in the order their commands appear in --help
_COMMAND_MODULES = (
    "accel.apps.compress",  # compress
    "accel.apps.export",  # export
    "accel.apps.generate",  # generate
    "accel.apps.predict",  # predict
    "accel.apps.drafts",  # distill, eval-draft
    "accel.apps.superposed",  # ngrams, complete
    "accel.apps.demo",  # demo
)

#: exit statuses: a bad command line or input (argparse's own), an interrupted command, an internal error
EXIT_ERROR = 2
EXIT_SIGINT = 128 + signal.SIGINT
EXIT_SIGTERM = 128 + signal.SIGTERM
EXIT_BUG = 70  # EX_SOFTWARE (sysexits.h)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is so that it unwinds (and cleans up) exactly as for Ctrl-C."""


def build_parser() -> argparse.ArgumentParser:
    """Build the top-level parser with every available subcommand."""
    parser = argparse.ArgumentParser(prog="accel", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="print tracebacks of errors (also ACCEL_DEBUG=1)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:  # a subpackage not yet present, or an optional dependency missing
            if exc.name and (exc.name == name or name.startswith(exc.name + ".") or not exc.name.startswith("accel")):
                continue
            raise
        register = getattr(module, "register", None)
        if register is not None:
            register(sub)
    return parser


def _split_debug(argv: list[str]) -> tuple[list[str], bool]:
    """``argv`` without ``--debug`` (accepted anywhere before a ``--``), and whether it was there."""
    end = argv.index("--") if "--" in argv else len(argv)
    head = [a for a in argv[:end] if a != "--debug"]
    return head + argv[end:], len(head) != end


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``accel`` console script; returns the process exit code."""
    argv, debug = _split_debug(list(sys.argv[1:] if argv is None else argv))
    debug = debug or os.environ.get("ACCEL_DEBUG", "") not in ("", "0")
    try:  # Ctrl-C while the subcommands' modules load: one line, as during a command
        parser = build_parser()
    except KeyboardInterrupt:
        return _fail("accel", "interrupted (Ctrl-C)", EXIT_SIGINT, debug)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_ERROR
    return run_command(f"accel {args.command}", lambda: args.func(args), debug=debug)


def run_command(prog: str, func: Callable[[], int | None], debug: bool = False) -> int:
    """Run ``func`` inside the error boundary; return its exit code, or the code of the failure it raised."""
    try:
        with _sigterm_as_interrupt():
            return int(func() or 0)
    except Terminated:
        return _fail(prog, "terminated (SIGTERM)", EXIT_SIGTERM, debug)
    except KeyboardInterrupt:
        return _fail(prog, "interrupted (Ctrl-C)", EXIT_SIGINT, debug)
    except BrokenPipeError:  # the reader of our stdout went away (`accel ... | head`)
        _silence_stdout()
        return EXIT_ERROR
    except (AccelError, OSError, ValueError, MemoryError) as exc:
        return _fail(prog, describe_error(exc), EXIT_ERROR, debug)
    except Exception as exc:
        text = f"internal error, please report it: {type(exc).__name__}: {_one_line(str(exc))}"
        return _fail(prog, text + ("" if debug else " (run with --debug for the traceback)"), EXIT_BUG, debug)


def describe_error(exc: BaseException) -> str:
    """One line naming the problem: the message of an accel error, ``what: path`` of an OSError."""
    if isinstance(exc, MemoryError):
        return "out of memory" + (f": {_one_line(str(exc))}" if str(exc) else "")
    if isinstance(exc, OSError) and exc.strerror:
        where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)
        return f"{exc.strerror}: {where}" if where else exc.strerror
    errors = getattr(exc, "errors", None)  # pydantic.ValidationError: one "field: message" per problem
    if callable(errors) and type(exc).__name__ == "ValidationError":
        try:
            items = [f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in errors()]
            return f"invalid {getattr(exc, 'title', 'value')}: " + "; ".join(items)
        except (TypeError, KeyError):
            pass
    return _one_line(str(exc)) or type(exc).__name__


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _fail(prog: str, text: str, code: int, debug: bool) -> int:
    if debug:
        traceback.print_exc()
    _close_progress_bars()
    _flush_stdout()
    print(f"{prog}: error: {text}", file=sys.stderr)
    return code


def _close_progress_bars() -> None:
    """End the progress bars still open (a failure inside a loop), so the error starts on a line of its own instead
    of after a bar's carriage return."""
    tqdm = sys.modules.get("tqdm.std")
    for bar in list(getattr(getattr(tqdm, "tqdm", None), "_instances", ()) or ()):
        try:
            bar.close()
        except Exception:  # a bar that cannot close must not hide the error
            pass


def _flush_stdout() -> None:
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        _silence_stdout()


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's exit flush cannot fail again (Python's SIGPIPE advice)."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM into ``Terminated`` (a KeyboardInterrupt) while a command runs (main thread only)."""

    def handler(signum: int, frame: object) -> None:
        raise Terminated

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
