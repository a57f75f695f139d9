"""``metagpu dev``: the embedded default that ``make run`` starts.

Everything a newcomer needs to see metagpu work on one machine with no
cluster: the admission webhook on ``127.0.0.1:8443`` with a CA it generates,
the device plugin on simulated GPUs, and a simulated kubelet that the plugin
registers with and that allocates like the real one. The session itself lives
in :mod:`metagpu.dev_session` and what is typed at its prompt in
:mod:`metagpu.dev_prompt`; this module is the light CLI half (argparse only),
so ``metagpu --help`` stays instant.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Final

from metagpu.dev_prompt import PROMPT_HELP
from metagpu.examples import EXAMPLE_GPUS_FILE
from plugin.api.commands import Command

DEFAULT_RUN_DIR: Final = Path("run")
DEFAULT_LISTEN: Final = "127.0.0.1:8443"


# ---------------------------------------------------------------------- CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=DEFAULT_RUN_DIR,
        help="where the generated CA, sockets and the editable GPUs file go (default %(default)s)",
    )
    parser.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        help="webhook HOST:PORT (default %(default)s; port 0 picks a free one)",
    )
    parser.add_argument(
        "--gpus-file",
        type=Path,
        default=None,
        help="simulated GPUs to start from; copied into the run dir so it can be edited "
        f"(default {EXAMPLE_GPUS_FILE.relative_to(EXAMPLE_GPUS_FILE.parent.parent)})",
    )
    parser.add_argument(
        "--webhook-config", type=Path, default=None, help="webhook config file (optional)"
    )
    parser.add_argument(
        "--plugin-config", type=Path, default=None, help="device plugin config file (optional)"
    )
    parser.add_argument(
        "--mps",
        action="store_true",
        help="the device plugin supervises an MPS control daemon (the documented stand-in "
        "for nvidia-cuda-mps-control) on the simulated GPUs: limits in every allocation, "
        "the daemon's state in `devices`, `mps kill` to watch it recover",
    )
    parser.add_argument(
        "--dra",
        action="store_true",
        help="DRA mode instead: the DRA kubelet plugin on the simulated GPUs, registered with "
        "a simulated kubelet over the real protos, and claims in memory: `claim`, `allocate`, "
        "`prepare`, `slice` at its prompt",
    )


def run(args: argparse.Namespace) -> int:
    from metagpu.dev_session import DevOptions, run_dev  # noqa: PLC0415 - grpc, aiohttp: not for --help

    options = DevOptions(
        run_dir=args.run_dir,
        listen=args.listen,
        gpus_file=args.gpus_file or EXAMPLE_GPUS_FILE,
        webhook_config=args.webhook_config,
        plugin_config=args.plugin_config,
        mps=args.mps,
        dra=args.dra,
    )
    if options.dra:
        from metagpu.dev_dra_session import run_dra_dev  # noqa: PLC0415 - as above

        return run_dra_dev(options)
    return run_dev(options)


COMMANDS = (
    Command(
        name="dev",
        help="the embedded default: webhook + device plugin on simulated GPUs",
        description=(
            "Run the webhook (generated CA, 127.0.0.1) and the device plugin on simulated\n"
            "GPUs against a simulated kubelet, in one process, with no cluster. Prints how\n"
            "to try it and reads commands on stdin.\n\n" + PROMPT_HELP
        ),
        add_arguments=add_arguments,
        run=run,
    ),
)
