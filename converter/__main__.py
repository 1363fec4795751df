"""`python -m converter` and the `vae-convert` command's entry point.

SIGINT and SIGTERM are handled from the first moment: the first one unwinds the run as Ctrl-C does (the work folder
is removed on the way out) and later ones are ignored, so that cleanup is not cut short. The process then ends with
os._exit, skipping the interpreter's teardown: JAX's runtime threads can crash it when a computation was interrupted.
"""

import os
import signal
import sys


def _interrupted(signum, frame):
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


def main():
    signal.signal(signal.SIGINT, _interrupted)
    signal.signal(signal.SIGTERM, _interrupted)
    try:
        from converter.cli import run

        code = run()
    except KeyboardInterrupt:  # before the command line ran (while importing)
        print("error: interrupted", file=sys.stderr)
        code = 130
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
