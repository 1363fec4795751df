"""`python -m converter` and the `vae-convert` command's entry point.

SIGINT and SIGTERM are handled from the first moment, by undoing the run's changes in the handler itself (the work
folder goes, an output moved aside for --force comes back) and ending the process with exit 130. No exception is
raised to unwind the run: code deep in JAX, PyTorch or a finalizer could swallow it. os._exit skips the
interpreter's teardown, where the runtime threads of an interrupted computation can crash the process. From the
handler on, the error line is the only thing written to stderr: other threads still running (an Orbax write whose
files the handler removes, say) fail noisily, and their tracebacks would bury it.
"""

import contextlib
import os
import signal
import sys

from converter.output import abandon_all

EXIT_INTERRUPTED = 130
EXIT_BAD_INPUT = 3  # InputError's


def _interrupted(signum, frame):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the cleanup below is not to be cut short by a second signal
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        stderr = _stderr_for_the_error_line()
        try:
            outcome = abandon_all()
            line = f"error: interrupted{'; ' + outcome if outcome else ''}"
        except OSError as e:
            line = f"error: interrupted; undoing the run's changes failed: {e}"
        with contextlib.suppress(OSError):
            os.write(stderr, f"{line}\n".encode())
    finally:
        os._exit(EXIT_INTERRUPTED)


def _stderr_for_the_error_line() -> int:
    """Points fd 2 at /dev/null for every other thread; returns a copy of it for the handler's own line (-1 when
    the process has no stderr)."""
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.flush()
    try:
        stderr = os.dup(2)
    except OSError:
        return -1
    with contextlib.suppress(OSError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
    return stderr


def main():
    signal.signal(signal.SIGINT, _interrupted)
    signal.signal(signal.SIGTERM, _interrupted)
    try:
        os.getcwd()  # before PyTorch's import, which exits 2 (the usage code) without one
    except OSError:
        os.write(2, b"error: the current folder no longer exists; run vae-convert from an existing folder\n")
        os._exit(EXIT_BAD_INPUT)
    from converter.cli import run

    code = run()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
