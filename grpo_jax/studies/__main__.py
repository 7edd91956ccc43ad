"""`python -m grpo_jax.studies list | design NAME [NAME ...] | all | verdicts NAME [NAME ...] |
all | run NAME [NAME ...] | all --tier=full|mini --workdir=DIR [--publish] | fingerprint
[--steps=N] | cpu-mask`."""

from __future__ import annotations

import argparse
import sys
import traceback

from grpo_jax import studies


def _list() -> int:
    for name in studies.NAMES:
        study = studies.get(name)
        print(f"{name}: {study.question}")
        for tier_name, tier in study.tiers.items():
            arms = len(tier.arms if tier.arms is not None else study.arms)
            print(f"  {tier_name}: {arms} arms x {len(tier.bases) or 1} base(s) x "
                  f"{len(tier.seeds)} seeds; {tier.cost}")
    return 0


def _design(names: list[str], check: bool) -> int:
    names = list(studies.NAMES) if names == ["all"] else names
    unknown = [n for n in names if n not in studies.NAMES]
    if unknown:
        print(f"error: design: unknown study {unknown[0]!r}; expected all or one of "
              f"{', '.join(studies.NAMES)}", file=sys.stderr)
        return 2
    from grpo_jax.studies import publish

    stale = []
    for name in names:
        study = studies.get(name)
        if check:
            with open(publish.readme_path(study), encoding="utf-8") as f:
                text = f.read()
            if publish.committed_design(text) != publish.design_block(study):
                stale.append(name)
                print(f"[studies] {name}: design block differs from the code", flush=True)
            for line, words in publish.written_numbers(text):
                stale.append(name)
                print(f"[studies] {name}: README.md line {line} holds a figure of the study's "
                      f"own outside the generated blocks: {words.strip()[:80]}", flush=True)
        elif publish.write_design(study):
            print(f"[studies] wrote {publish.readme_path(study)} (its design block)", flush=True)
    return 1 if stale else 0


def _verdicts(names: list[str]) -> int:
    """Applies the current claims and rule to the published summaries (no runs) and prints
    each claim's verdict before -> after."""
    names = list(studies.NAMES) if names == ["all"] else names
    unknown = [n for n in names if n not in studies.NAMES]
    if unknown:
        print(f"error: verdicts: unknown study {unknown[0]!r}; expected all or one of "
              f"{', '.join(studies.NAMES)}", file=sys.stderr)
        return 2
    from grpo_jax.studies import publish

    print("| study | claim | kind | before | after |\n|---|---|---|---|---|")
    for name in names:
        found = publish.reapply_rule(studies.get(name))
        if found is None:
            print(f"| {name} | - | - | no published full tier | - |")
            continue
        before = [v["verdict"] for v in found[0]]
        before += ["-"] * (len(found[1]) - len(before))
        for old, v in zip(before, found[1]):
            print(f"| {name} | {publish.short_text(v['claim'], 10)} | {v['kind']} | {old} | "
                  f"{v['verdict']} |")
    index = publish.write_index()
    print(f"[studies] wrote {index} (its index of verdicts)", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m grpo_jax.studies",
                                     description=studies.__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="every study with the cost of each tier")
    design = commands.add_parser(
        "design", help="rewrite experiments/NAME/README.md's design block from the code "
                       "(the full tier's configs; no runs)")
    design.add_argument("names", nargs="+", metavar="NAME", help="a study or all")
    design.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 if a README's block differs from the code "
                             "or its hand-written text holds a figure of the study's own")
    verdicts = commands.add_parser(
        "verdicts", help="apply the current claims and verdict rule to the published "
                         "summary.json files (no runs); print each verdict before -> after")
    verdicts.add_argument("names", nargs="+", metavar="NAME", help="a study or all")
    printed = commands.add_parser(
        "fingerprint", help="run a few steps of the main base's pretraining and print a hash "
                            "of its losses: machines with equal fingerprints compute a study's "
                            "runs alike (seconds; nothing written)")
    printed.add_argument("--steps", type=int, default=20, help="pretraining steps (20)")
    commands.add_parser(
        "cpu-mask", help="build the CPU mask (grpo_jax/studies/cpu_mask.c) and print its path, "
                         "for LD_PRELOAD: the process's CPUID answers as the CPU that built "
                         "the published bases")
    run = commands.add_parser("run", help="build, run, analyse studies, one after another")
    run.add_argument("names", nargs="+", metavar="NAME",
                     help=f"a study ({', '.join(studies.NAMES)}) or all (in that order; "
                          "shared bases are built once; a study that fails is said, with its "
                          "traceback, and the ones after it go on; the exit status is 1)")
    run.add_argument("--tier", default="full", choices=("full", "mini"))
    run.add_argument("--workdir", required=True,
                     help="runs, shared bases and outputs (DIR/bases, DIR/NAME)")
    run.add_argument("--publish", action="store_true",
                     help="copy the outputs into experiments/NAME/ (full tier only)")
    args = parser.parse_args(argv)
    if args.command == "list":
        return _list()
    if args.command == "design":
        return _design(args.names, args.check)
    if args.command == "verdicts":
        return _verdicts(args.names)
    if args.command == "cpu-mask":
        from grpo_jax.studies.cpu_mask import build

        try:
            print(build())
        except RuntimeError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        return 0
    if args.command == "fingerprint":
        if args.steps < 1:
            print(f"error: --steps: expected a positive integer, got {args.steps}",
                  file=sys.stderr)
            return 2
        from grpo_jax.studies.fingerprint import fingerprint

        found = fingerprint(args.steps)
        print(f"fingerprint {found['fingerprint']} (the main base's pretraining, "
              f"{found['steps']} steps, last loss {found['last_loss']!r}) on "
              f"{found['machine']}"
              + (f", XLA_FLAGS {found['xla_flags']!r}" if found["xla_flags"] else ""))
        if args.steps == 20:
            from grpo_jax.studies.fingerprint import SECOND_BUILD

            print("the published bases' build (the second build)"
                  if found["fingerprint"] == SECOND_BUILD else
                  f"not the published bases' build (the second build prints {SECOND_BUILD}); "
                  "on x86 Linux, try the CPU mask: python -m grpo_jax.studies cpu-mask")
        return 0
    if args.publish and args.tier != "full":
        print("error: --publish: only the full tier's results are published", file=sys.stderr)
        return 2
    names = list(studies.NAMES) if args.names == ["all"] else args.names
    for name in names:
        if name not in studies.NAMES:
            print(f"error: run: unknown study {name!r}; expected all or one of "
                  f"{', '.join(studies.NAMES)}", file=sys.stderr)
            return 2
    from grpo_jax.runner.checks import output_dir_problem

    problem = output_dir_problem(args.workdir)
    if problem:
        print(f"error: --workdir: {problem}; expected a directory this process can write "
              "(existing, or created when missing)", file=sys.stderr)
        return 2
    failed = []
    for name in names:
        try:
            stopped = _run_one(name, args, argv)
        except Exception as err:  # one study's error: said, and the studies after it go on
            if len(names) == 1:
                raise
            traceback.print_exc()
            print(f"[studies] {name} failed: {type(err).__name__}: {err}; the studies after "
                  "it go on (its finished runs are kept: `run NAME` again once mended)",
                  file=sys.stderr, flush=True)
            failed.append(name)
            continue
        if stopped is not None:  # a bad name, or a signal: the studies after it do not start
            return stopped
    if failed:
        print(f"error: run: {len(failed)} of {len(names)} studies failed: "
              f"{', '.join(failed)} (each one's traceback above)", file=sys.stderr)
        return 1
    return 0


def _run_one(name: str, args, argv) -> int | None:
    """Runs one study; None when it finished, else the exit status to stop with."""
    try:
        study = studies.get(name)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    from grpo_jax.studies import common

    try:
        result = common.execute(study, args.tier, args.workdir, publish=args.publish,
                                argv=["python", "-m", "grpo_jax.studies", *argv])
    except Exception as err:  # a run stopped by SIGTERM / SIGINT saved its checkpoint
        if type(err).__name__ != "Preempted":
            raise
        print(f"{err}\n[studies] the same command resumes {name}", flush=True)
        return getattr(err, "status", 0)
    if result is None:  # another process runs some of its runs: said, and skipped
        return None
    from grpo_jax import storage

    print(storage.read_text(storage.join(args.workdir, name, "out", "table.md")), end="")
    print(f"[studies] {name}: {len(result['contrasts'])} contrasts, written to "
          f"{args.workdir.rstrip('/')}/{name}/out/", flush=True)
    return None


if __name__ == "__main__":
    sys.exit(main())
