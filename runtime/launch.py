"""`python -m runtime launch`: torchrun from Python, with the ranks' errors printed last.

    python -m runtime launch --nproc-per-node 2 --schedule 1f1b --microbatches 8 --steps 10

takes torchrun's own flags (`torch.distributed.run`'s parser: --nproc-per-node, --nnodes,
--rdzv-*, --log-dir, ...) and the executor's (`python -m runtime --help`) in any order, and
runs `torchrun [its flags] -m runtime [the executor's flags]` through torch's elastic launcher
(`torch.distributed.run.run`, which calls `torch.distributed.launcher.api.elastic_launch`).
When a rank fails, torchrun buries the rank's one-line error under its own report; here each
failed rank's error lines (read back from its stderr, which is shown live and also written to
the launcher's log directory) are printed last, and the exit code is the first failed rank's:
1 a peer failed or --check found a mismatch, 2 a bad configuration (runtime/cli.py), 128 + N
for a rank killed by signal N.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import get_args_parser, parse_args, run

USAGE = "usage: python -m runtime launch [torchrun options] [python -m runtime options]"
# The launcher runs this module, always: torchrun's ways to name a script are not taken.
NOT_TAKEN = {"-m", "--module", "--no-python", "--no_python", "--run-path", "--run_path"}
ERROR_LINE = re.compile(r"\berror\b", re.IGNORECASE)


def split_argv(argv: list[str], launcher: argparse.ArgumentParser) -> tuple[list[str], list[str]]:
    """(torchrun's tokens, the executor's tokens): a token is torchrun's when it is one of its
    option strings (or `--option=value` of one), with the value that option takes; the
    executor's flags share no name with torchrun's. ValueError for a flag this command sets."""
    takes_value = {}
    for action in launcher._actions:
        for option in action.option_strings:
            takes_value[option] = action.nargs != 0
    ours, theirs = [], []
    i = 0
    while i < len(argv):
        token = argv[i]
        name = token.split("=", 1)[0]
        if name in NOT_TAKEN:
            raise ValueError(f"{name}: python -m runtime launch always runs the runtime module")
        if name in takes_value and name not in ("-h", "--help"):
            ours.append(token)
            if takes_value[name] and "=" not in token and i + 1 < len(argv):
                ours.append(argv[i + 1])
                i += 1
        else:
            theirs.append(token)
        i += 1
    return ours, theirs


def _given(tokens: list[str], *names: str) -> bool:
    return any(t.split("=", 1)[0] in names for t in tokens)


def error_lines(log_dir: Path, failures: dict) -> list[str]:
    """One or more lines per failed rank, in rank order: the lines of its stderr log (latest
    attempt) that name an error, else its last line, else its exit code."""
    lines = []
    for rank, failure in sorted(failures.items()):
        logs = sorted(log_dir.glob(f"**/attempt_*/{failure.local_rank}/stderr.log"),
                      key=lambda p: int(p.parent.parent.name.removeprefix("attempt_")))
        text = logs[-1].read_text(errors="replace").splitlines() if logs else []
        text = [line.rstrip() for line in text if line.strip()]
        found = [line for line in text if ERROR_LINE.search(line)] or text[-1:]
        lines += found or [f"rank {rank}: exited with code {failure.exitcode}"]
    return lines


def exit_code(failure) -> int:
    """A failed rank's exit code as a shell reports it (128 + N for signal N)."""
    code = failure.exitcode
    return 128 - code if code < 0 else code


def main(argv: list[str] | None = None) -> int:
    """Launch the executor under torch's elastic launcher; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    launcher = get_args_parser()
    if argv[:1] in (["-h"], ["--help"]):
        print(f"{USAGE}\n\n{__doc__}\ntorchrun options:\n{launcher.format_help()}")
        return 0
    try:
        ours, theirs = split_argv(argv, launcher)
    except ValueError as exc:
        print(f"runtime launch: error: {exc}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="runtime-launch-") as scratch:
        if not _given(ours, "--log-dir", "--log_dir"):
            ours += ["--log-dir", scratch]
        if not _given(ours, "--tee", "-t", "--redirects", "-r"):
            ours += ["--tee", "2"]  # stderr shown live and kept in the log directory
        args = parse_args([*ours, "-m", "runtime", *theirs])
        try:
            run(args)
        except ChildFailedError as exc:
            _, first = exc.get_first_failure()
            print("\n".join(error_lines(Path(args.log_dir), exc.failures)), file=sys.stderr, flush=True)
            return exit_code(first)
    return 0
