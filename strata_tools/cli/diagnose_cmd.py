"""``strata diagnose rm-noise|shift|rm-overfit|memory|repetition|annotators|all``: the article's troubleshooting
table (seed §5.1, R16) run against a live stack.

Each command prints PASS or ALARM with the number and the suggested cure; ``all`` prints one table.
Exit codes: 0 PASS, 1 ALARM, 2 a check could not run (or a usage error). Service addresses and
thresholds are flags or ``STRATA_*`` variables (``strata diagnose all --help``); see
docs/diagnostics.md.
"""

from __future__ import annotations

import argparse
import threading

from strata.config import add_settings_flags, settings_from_flags
from strata.errors import CliError
from strata.lifecycle import stop_on_signals
from strata.telemetry import start_metrics_server
from strata_tools.diagnose.exporter import exporter_registry
from strata_tools.diagnose.settings import DiagnoseSettings

CHECK_NAMES = ("rm-noise", "shift", "rm-overfit", "memory", "repetition", "annotators", "hacking")
HELP = {
    "rm-noise": "score the same responses repeatedly; ALARM when the spread is high (cure: R8 ensemble/temperature)",
    "shift": "mean log-prob of recent rollouts under the current policy; ALARM under -150 (cure: KL warm-up)",
    "rm-overfit": "Spearman of the RM vs the oracle/strong RM on fresh prompts; ALARM under 0.7 "
                  "(cure: adversarial augmentation)",
    "memory": "generator memory across rollout rounds; ALARM when it keeps growing (cure: free the KV cache)",
    "repetition": "the same prompt rolled out N times; ALARM over 40%% identical (cure: temperature/top-p)",
    "annotators": "annotator drift from svc_annotation: ALARM when any annotator drifts from the gold items "
                  "(cure: re-brief, review since the alarm item; R18)",
    "hacking": "the live audit's hacking gap (light minus strong RM on the same Level-1 answers): ALARM when it "
               "grew past hacking_gap_bound since the first audited policy versions (cure: re-distil, lcb, escalate)",
    "all": "every check in one table; non-zero exit on any ALARM",
    "exporter": "serve stack-wide metrics (consumer lag, tier mix, cost per tier, escalations) for Prometheus",
}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("diagnose", help="R16 diagnostics against a running stack (PASS/ALARM + cure)")
    checks = parser.add_subparsers(dest="check", metavar="CHECK", required=True)
    for name in (*CHECK_NAMES, "all", "exporter"):
        sub = checks.add_parser(name, help=HELP[name], description=HELP[name])
        add_settings_flags(sub, DiagnoseSettings)
        sub.add_argument("--json", action="store_true", help="print the result(s) as JSON")
        if name == "all":
            sub.add_argument("--skip", default="",
                             help=f"comma-separated checks to leave out ({', '.join(CHECK_NAMES)})")
        sub.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from strata_tools.diagnose import runner

    try:
        settings = settings_from_flags(DiagnoseSettings, args)
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    if args.check == "exporter":
        return serve_exporter(settings)
    if args.check == "all":
        skip = [s.strip() for s in args.skip.split(",") if s.strip()]
        unknown = sorted(set(skip) - set(CHECK_NAMES))
        if unknown:
            raise CliError(f"--skip: unknown check(s) {', '.join(unknown)}; known: {', '.join(CHECK_NAMES)}")
        results = runner.run_all(settings, skip)
        print(runner.as_json(results) if args.json else runner.format_table(results))
        return runner.exit_code(results)
    result = runner.run_check(args.check, settings)
    print(runner.as_json([result]) if args.json else runner.format_result(result))
    return runner.exit_code([result])


def serve_exporter(settings: DiagnoseSettings) -> int:
    groups = [g.strip() for g in settings.lag_groups.split(",") if g.strip()]
    host = settings.metrics_bind_host
    port = start_metrics_server(settings.exporter_port, exporter_registry(settings, groups), host=host)
    print(f"strata exporter: http://{host}:{port}/metrics (consumer lag of {len(groups)} groups, cost ledger)")
    stop: threading.Event = stop_on_signals()
    stop.wait()
    return 0
