"""Is the live audit's catch estimate the oracle's? (issue 61: "the audit stream's catch estimate is within
±0.1 of the oracle's on the same answers")

Reads one judge's audited Level-1 answers (``strata.audit.read_labels``: the strong RM's, kept by the reward
service, or people's, kept by the desk; each with the judge's score, whether the rule escalated the answer and
whether the judge called it bad), their texts from the content store, and scores each with the oracle
(``strata_tools.task.oracle``; a bad case under 1.5, as the benches count). Prints the audit's catch
(escalated among the answers its judge calls bad) and false pass (bad among the passed) beside the oracle's on
the same answers, with 95 % intervals from a bootstrap over prompts (the
answers to one prompt are not independent), and the difference. Run it against a live stack's Redis, after
a `strata demo` or `strata train` run and before `strata down`:

    STRATA_STATE_DIR=/tmp/run STRATA_AUDIT_LEVEL1_SHARE=1.0 strata demo --updates 24 --headline-prompts 0
    STRATA_STATE_DIR=/tmp/run .venv/bin/python scripts/audit_vs_oracle.py               # the strong RM's audit
    STRATA_STATE_DIR=/tmp/run .venv/bin/python scripts/audit_vs_oracle.py --judge human # people's
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence

from strata import redis_client
from strata.audit import HUMAN_AUDIT, STRONG_AUDIT, read_labels
from strata.config import StrataSettings
from strata.content_store import ContentNotFoundError, ContentStore
from strata_tools.intervals import cluster_bootstraps
from strata_tools.rm.onpolicy import BAD_THRESHOLD
from strata_tools.task.oracle import infer_prompt_info, oracle_score, prompt_info
from strata_tools.task.suite import load_suite


def _share(hits: Sequence[bool], among: Sequence[bool], idx: Sequence[int]) -> float:
    items = [i for i in idx if among[i]]
    return sum(hits[i] for i in items) / len(items) if items else math.nan


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bad-below", type=float, default=BAD_THRESHOLD, help="the oracle's bad-case threshold")
    parser.add_argument("--since-version", type=int, default=0, help="only answers of this policy version on")
    parser.add_argument("--judge", choices=("strong", "human"), default="strong",
                        help="whose audit: the strong RM's (the reward service) or people's (the desk)")
    parser.add_argument("--audit-bad-below", type=float, default=None,
                        help="call an answer bad where the judge's score is under this, as audit_bad_below or "
                             "human_bad_below would (default: the call it tallied)")
    args = parser.parse_args()

    settings = StrataSettings()
    with redis_client.connect(settings.redis_address, socket_timeout=10) as client:
        store = ContentStore(client, settings.content_ttl_s, settings.content_max_bytes)
        judge = STRONG_AUDIT if args.judge == "strong" else HUMAN_AUDIT
        labels = [label for label in read_labels(client, judge) if label.escalated is not None
                  and label.bad is not None and label.policy_version >= args.since_version]
        by_text = {record.text: record for record in load_suite()}
        rows, expired = [], 0
        for label in labels:
            try:
                prompt, response = store.get_texts([label.prompt_hash, label.response_hash])
            except ContentNotFoundError:
                expired += 1
                continue
            record = by_text.get(prompt)
            info = prompt_info(record) if record is not None else infer_prompt_info(prompt)
            rows.append((label, oracle_score(info, response) < args.bad_below))
    if not rows:
        print(f"no audited answers of the {args.judge} judge with their route kept (a stack still up; the strong "
              "RM's need STRATA_AUDIT_LEVEL1_SHARE > 0, people's STRATA_ANNOTATE_LEVEL1_SHARE > 0 and annotators)",
              file=sys.stderr)
        return 1

    escalated = [label.escalated is True for label, _ in rows]
    passed = [not e for e in escalated]
    audit_bad = [label.bad is True if args.audit_bad_below is None else label.judge < args.audit_bad_below
                 for label, _ in rows]
    oracle_bad = [bad for _, bad in rows]

    def statistics(idx: Sequence[int]) -> list[float]:
        catch_audit, catch_oracle = _share(escalated, audit_bad, idx), _share(escalated, oracle_bad, idx)
        pass_audit, pass_oracle = _share(audit_bad, passed, idx), _share(oracle_bad, passed, idx)
        return [catch_audit, catch_oracle, catch_audit - catch_oracle,
                pass_audit, pass_oracle, pass_audit - pass_oracle]

    intervals = cluster_bootstraps(statistics, [label.prompt_hash for label, _ in rows])
    versions = [label.policy_version for label, _ in rows]
    print(f"{len(rows)} audited answers of policy v{min(versions)}-v{max(versions)} on "
          f"{len({label.prompt_hash for label, _ in rows})} prompts ({expired} left out: texts expired); "
          f"bad by the {args.judge} judge {sum(audit_bad)}, by the oracle {sum(oracle_bad)}; passed {sum(passed)}")
    names = [f"catch ({args.judge})", "catch (oracle)", "catch difference", f"false pass ({args.judge})",
             "false pass (oracle)", "false pass difference"]
    for name, interval in zip(names, intervals, strict=True):
        print(f"  {name:<24} {interval}")
    catch_gap = intervals[2].estimate
    print(f"audit_vs_oracle judge={args.judge} catch_diff={catch_gap:+.3f} catch_diff_lo={intervals[2].low:+.3f} "
          f"catch_diff_hi={intervals[2].high:+.3f} within_0.1={abs(catch_gap) <= 0.1} answers={len(rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
