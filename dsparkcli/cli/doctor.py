"""`dspark doctor`: which llama.cpp, its version, devices and DSpark capabilities."""

from __future__ import annotations

import typer
from rich.table import Table

from dsparkcli import doctor as core
from dsparkcli.cli._common import JsonOpt, LlamaBinOpt
from dsparkcli.cli._output import out, print_json
from dsparkcli.errors import EngineCapabilityError
from dsparkcli.engine import BUILD_HINT

HELP = """Show the llama.cpp engine dspark uses and what it can do.

\b
Examples:
  dspark doctor
  dspark doctor --json
  dspark doctor --llama-bin ~/llama.cpp/build/bin/llama-server
"""


def doctor(llama_bin: LlamaBinOpt = None, json_out: JsonOpt = False) -> None:
    report = core.diagnose(llama_bin)
    if json_out:
        print_json(report)
    else:
        table = Table(show_header=False, box=None)
        table.add_column(style="bold", no_wrap=True)
        table.add_column(overflow="fold")
        table.add_row("llama-server", report.server)
        table.add_row("found via", report.found_via)
        table.add_row("version", f"{report.version or '?'} (commit {report.commit or '?'})")
        table.add_row("backend", report.backend)
        table.add_row("devices", "\n".join(report.devices) or "CPU only")
        caps = report.capabilities
        yes = {True: "yes", False: "NO"}
        table.add_row("draft-dspark", yes[caps.draft_dspark])
        table.add_row("--mmproj", yes[caps.mmproj])
        table.add_row("--spec-synth-len", yes[caps.spec_synth_len])
        table.add_row("--spec-draft-p-min", yes[caps.spec_draft_p_min])
        out.print(table)
        for problem in report.problems:
            out.print(f"warning: {problem}")
    if not report.ok:
        raise EngineCapabilityError(f"{report.server} cannot run DSpark drafts (no draft-dspark)", hint=BUILD_HINT)


def register(app: typer.Typer) -> None:
    app.command("doctor", help=HELP)(doctor)
