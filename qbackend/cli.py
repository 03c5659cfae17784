"""`qbackend` command line: `info` (what this machine runs, and why), `explain`, `convert`, `bench`,
`build` (the native library, after a pure-Python install)."""
from __future__ import annotations

import argparse
import json
import os
import sys


def _gib(n) -> str:
    return f"{n / 2**30:.0f} GiB" if n else "?"


def _quantize_verdict(provider, device) -> str | None:
    """For a quantize-only provider: None where one of its rules takes dynamic per-token bf16 to
    the device's fp8, else the first rule's reason (so that `info` does not report such a provider
    as lacking scaled_mm)."""
    import torch

    from qbackend import probe
    from qbackend.problem import Granularity, Op, Problem

    formats = probe.native_fp8(device.arch) or (torch.float8_e4m3fn,)
    problem = Problem(Op.QUANTIZE, torch.bfloat16, formats[0], scale_a=Granularity.TOKEN)
    reasons = [r.mismatch(device, problem)[1] for r in provider.rules if r.op is Op.QUANTIZE]
    return None if None in reasons else (reasons[0] if reasons else "has no rules")


def info_report(simulate: str | None = None, all_devices: bool = False) -> dict:
    """Everything `qbackend info` prints, as a JSON-ready dict; all_devices adds each visible GPU's
    selection (a host may hold GPUs of different archs: each gets its own providers)."""
    if simulate:
        os.environ["QBACKEND_SIMULATE"] = simulate
    import torch

    import qbackend
    from qbackend import registry
    from qbackend.problem import PROBLEM_KINDS, Op

    reg = registry.reload() if simulate else registry.get()
    device = qbackend.device_info()
    table = qbackend.selection_table(device)
    providers = []
    for lp in reg.loaded:
        p = lp.provider
        served = [kind for kind, (name, _) in table.items() if name == p.name]
        verdicts = [qbackend.select(kind, device).verdicts for kind in PROBLEM_KINDS]
        mine = [dict(v)[p.name] for v in verdicts]
        ok = [v for v in mine if v.ok]
        if p.name in reg.disabled:
            available, reason = False, "disabled by QBACKEND_DISABLE"
        elif all(r.op is Op.QUANTIZE for r in p.rules):  # a quantize-only provider
            why = _quantize_verdict(p, device)
            available, reason = why is None, why or "serves quantize (no GEMM kind)"
        elif ok:
            available = True
            reason = ("serves " + ", ".join(served)) if served else "usable; outranked for every kind"
        else:
            available = False
            reasons = list(dict.fromkeys(v.reason for v in mine))
            reason = reasons[0] if len(reasons) == 1 else "; ".join(reasons[:3])
        providers.append({"name": p.name, "available": available, "reason": reason,
                          "source": lp.source, "priority": p.priority,
                          "description": p.description, "info": p.info()})
    libs = reg.native_libraries()
    if device.simulated:
        for lib in libs:
            lib["counts_as_built_for"] = device.arch
    report = {
        "qbackend_version": qbackend.__version__, "torch_version": torch.__version__,
        "device": device.to_json(),
        "native_libraries": libs,
        "providers": providers,
        "selection": {kind: name for kind, (name, _) in table.items()},
        "selection_paths": _chosen_paths(table, device),
        "selection_reasons": {kind: reasons for kind, (_, reasons) in table.items()},
        "forced_provider": reg.forced, "disabled_providers": sorted(reg.disabled),
        "plugin_errors": [{"source": e.source, "stage": e.stage, "message": e.message}
                          for e in reg.errors],
    }
    if all_devices:
        from qbackend.probe import visible_gpus

        report["all_devices"] = [
            {"device": f"cuda:{index}", "name": gpu.name, "arch": gpu.arch,
             "selection": {kind: name for kind, (name, _) in qbackend.selection_table(gpu).items()}}
            for index, gpu in visible_gpus()]
    return report


def _chosen_paths(table: dict, device) -> dict:
    """{kind: how the chosen provider serves it} where its verdict says more than "ok" (the torch
    provider names the torch op it calls)."""
    import qbackend

    paths = {}
    for kind, (name, _) in table.items():
        if name is None:
            continue
        reason = dict(qbackend.select(kind, device).verdicts)[name].reason
        if reason.startswith("ok: "):
            paths[kind] = reason[len("ok: "):]
    return paths


def _print_info(r: dict) -> None:
    d = r["device"]
    print(f"qbackend {r['qbackend_version']}  (torch {r['torch_version']})")
    sim = "  [simulated]" if d["simulated"] else ""
    print(f"device: {d['name']}  arch {d['arch']}  backend {d['backend']}{sim}")
    print(f"  probe: {d['probe']};  native fp8: {', '.join(d['fp8_dtypes']) or 'none'};  "
          f"multiprocessors: {d['multiprocessors'] or '?'};  memory: {_gib(d['memory_bytes'])}")
    if d["driver_version"] or d["runtime_version"]:
        print(f"  driver: {d['driver_version'] or '?'};  torch runtime: {d['runtime_version'] or '?'}")
    for note in d["notes"]:
        print(f"  probe note: {note}")
    print("native libraries:")
    for lib in r["native_libraries"] or [{"name": "(none registered)", "loaded": False}]:
        state = "loaded" if lib.get("loaded") else "not loaded"
        archs = " ".join(lib.get("archs") or []) or "-"
        extra = f"  ({lib['error']})" if lib.get("error") else ""
        built = f"  [counts as built for {lib['counts_as_built_for']}]" if lib.get("counts_as_built_for") else ""
        found_in = f" (from {lib['found_in']})" if lib.get("loaded") and lib.get("found_in") else ""
        print(f"  {lib['name']}: {state}{found_in}; path {lib.get('path') or '-'}; archs {archs}{extra}{built}")
        for line in lib.get("details") or ():
            print(f"    {line}")
        if lib.get("hint"):
            print(f"    to build it: {lib['hint']}")
        if lib.get("build_log"):
            print(f"    last build log: {lib['build_log']}")
    print("providers (priority order):")
    for p in r["providers"]:
        mark = "yes" if p["available"] else "no "
        print(f"  [{mark}] {p['name']:<10} {p['reason']}")
        print(f"        from {p['source']}: {p['description']}")
    print("selection:")
    for kind, name in r["selection"].items():
        path = f"  ({r['selection_paths'][kind]})" if kind in r["selection_paths"] else ""
        print(f"  {kind:<28} -> {name or 'none'}{path}")
        for prov, why in r["selection_reasons"][kind].items():
            print(f"  {'':<28}    {prov}: {why}")
    if "all_devices" in r:
        print("every visible GPU:" + ("" if r["all_devices"] else " none (the selection above is the CPU's)"))
        for d in r["all_devices"]:
            by_provider = {}
            for kind, name in d["selection"].items():
                by_provider.setdefault(name or "none", []).append(kind)
            print(f"  {d['device']}: {d['name']}  arch {d['arch']}")
            for name, kinds in by_provider.items():
                print(f"    {name}: {', '.join(kinds)}")
    if r["forced_provider"] or r["disabled_providers"]:
        print(f"overrides: forced={r['forced_provider']} disabled={','.join(r['disabled_providers']) or '-'}")
    if r["plugin_errors"]:
        print("plugin errors (skipped):")
        for e in r["plugin_errors"]:
            print(f"  {e['source']}: {e['stage']}: {e['message']}")


def _cmd_info(args) -> int:
    if args.simulate and args.all_devices:
        raise ValueError("--all-devices reports the GPUs that are here; it does not combine with --simulate")
    report = info_report(args.simulate, args.all_devices)
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        print()
    else:
        _print_info(report)
    return 0


def _cmd_explain(args) -> int:
    if args.simulate:
        os.environ["QBACKEND_SIMULATE"] = args.simulate
    import qbackend
    from qbackend import registry

    if args.simulate:
        registry.reload()
    for kind in args.kinds or qbackend.PROBLEM_KINDS:
        print(qbackend.explain(kind))
    return 0


def _cmd_build_rocm(args) -> int:
    from qbackend_providers import rocm_build

    try:
        requested = args.archs or os.environ.get("QBACKEND_ROCM_ARCHS")
        if requested:
            archs = rocm_build.parse_archs(requested)
        else:
            compiler = rocm_build.hipcc()
            archs = [a for a in rocm_build.ALL_ARCHS if compiler and rocm_build.compiler_knows(compiler, a)]
            if compiler and not archs:
                raise rocm_build.BuildError(f"{compiler} knows none of {', '.join(rocm_build.ALL_ARCHS)}: "
                                            "MI300 (gfx942) is supported from ROCm 6.0, MI350 (gfx950) from ROCm 7.0")
        path = rocm_build.build(archs, build_dir=args.build_dir, dest=args.dest)
    except rocm_build.BuildError as exc:
        print(f"qbackend build: error: {exc}", file=sys.stderr)
        return 2
    print(f"qbackend build: {path} is ready; `qbackend info` shows what loads it")
    return 0


def _cmd_build(args) -> int:
    from qbackend_providers import cuda_build

    if args.rocm:
        return _cmd_build_rocm(args)
    try:
        requested = args.archs or os.environ.get("QBACKEND_CUDA_ARCHS")
        if requested:
            archs = cuda_build.parse_archs(requested)
        else:
            archs = cuda_build.gpu_archs()
            if not archs:
                raise cuda_build.BuildError("no NVIDIA GPU is visible here, so there is no default arch: "
                                            "pass --archs all (every family) or a list such as --archs '89;90a'")
        path = cuda_build.build(archs, jobs=args.jobs, build_dir=args.build_dir, dest=args.dest)
    except cuda_build.BuildError as exc:
        print(f"qbackend build: error: {exc}", file=sys.stderr)
        return 2
    print(f"qbackend build: {path} is ready; `qbackend info` shows what loads it")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="qbackend", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="detected hardware, native libraries, providers, selection")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    info.add_argument("--simulate", metavar="ARCH", help="report for a simulated device "
                      "(sm_75, sm_80, sm_86, sm_89, sm_90, sm_100, gfx942, gfx950, cpu; an AMD arch may "
                      "name its ROCm release: gfx942:rocm6.2)")
    info.add_argument("--all-devices", action="store_true",
                      help="also list every visible GPU's selection (each GPU gets its own providers)")
    info.set_defaults(func=_cmd_info)
    explain = sub.add_parser("explain", help="every provider's verdict for problem kinds")
    explain.add_argument("kinds", nargs="*", help="problem kinds (default: all)")
    explain.add_argument("--simulate", metavar="ARCH")
    explain.set_defaults(func=_cmd_explain)
    build = sub.add_parser("build", help="compile the native CUDA library (incremental; needs nvcc, CMake, Ninja "
                           "and the `cuda` extra's nvidia-cutlass), or with --rocm the ROCm one (needs hipcc)")
    build.add_argument("--rocm", action="store_true", help="build libqbackend_rocm (csrc_rocm) with hipcc instead")
    build.add_argument("--archs", help="'all', 'native' or a list of 75;80;89;90a (default: $QBACKEND_CUDA_ARCHS, "
                       "else the families of the visible GPU); with --rocm 'all' or a list of gfx942;gfx950 "
                       "(default: $QBACKEND_ROCM_ARCHS, else those hipcc knows)")
    build.add_argument("--jobs", type=int,
                       help="parallel compile jobs (default: $QBACKEND_BUILD_JOBS, else the CPU count)")
    build.add_argument("--build-dir", help="build directory (default: build/cuda or build/rocm in a checkout, "
                       "else ~/.cache/qbackend/build or build-rocm)")
    build.add_argument("--dest", help="where the library goes (default: the package when writable, "
                       "else ~/.cache/qbackend/lib; both are searched by the loader)")
    build.set_defaults(func=_cmd_build)
    try:
        from .convert import add_convert_subcommand
    except ImportError:
        pass
    else:
        add_convert_subcommand(sub)
    from .bench_cli import add_bench_subcommand

    add_bench_subcommand(sub)
    return parser


def main(argv=None) -> int:
    import signal

    from .registry import NoProviderError

    if hasattr(signal, "SIGPIPE"):  # `qbackend info | head` ends quietly
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError, FileNotFoundError, FileExistsError, NoProviderError) as exc:
        print(f"qbackend {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
