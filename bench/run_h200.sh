#!/usr/bin/env bash
# Build check + GPU tests + benchmarks for libqbackend_cuda on an H200, logs under $RESULTS_DIR.
#   bash bench/run_h200.sh [tests|providers|random|tcases|tpaths|selection|marlin|minilm|tune|ab|tokens|qbench|qgroup|block|moe_tests|moe|semantics|accumulate|qsweep|bench|qbackend_bench|mbench|e2e|e2e_moe|ncu|ncu_detail|ncu_marlin|mtrace|memcheck|racecheck|wheel|buildtime]...
#   (default: tests tune qbench bench memcheck).
# Installs qbackend from this tree first (editable, no CUDA build, no downloads: the machine's torch,
# pluggy, safetensors and nvidia-ml-py are used). Expects the library built elsewhere, at
# providers/_lib/libqbackend_cuda.so (`qbackend build`) or $QBACKEND_CUDA_LIB. Each step has its
# own time limit and a failing step does not stop the rest.
# wheel:     the newest dist/qbackend-*-py3-none-linux_x86_64.whl (built on the CPU machine by
#            `nox -s wheel`; carry dist/) installed into a venv next to this machine's torch, GPU tests.
# buildtime: a from-scratch build of every family and of sm_90a alone, 16 jobs, no compiler cache.
set -u
OUT=${RESULTS_DIR:-/tmp/qb_out}
mkdir -p "$OUT"
export QBACKEND_CUDA_LIB=${QBACKEND_CUDA_LIB:-$PWD/providers/_lib/libqbackend_cuda.so}
export PYTHONUNBUFFERED=1
steps=${*:-tests tune qbench bench memcheck}
LOG="$OUT/log.txt"   # one log for every textual step
exec > >(tee -a "$LOG") 2>&1
QBACKEND_BUILD_CUDA=0 python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . ./tests/demo_provider
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv
python3 -c "from qbackend_providers import native as n; print(n.load_error() or n.build_info())"
for step in $steps; do
  t0=$(date +%s)
  case $step in
    tests)
      timeout 150 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_native_quantize.py 2>&1 | tail -15
      timeout 260 python3 -m pytest -q -p no:cacheprovider --maxfail=5 tests/gpu/test_native_scaled_mm.py 2>&1 | tail -40 ;;
    providers)
      timeout 400 python3 -m pytest -q -p no:cacheprovider -W ignore::UserWarning tests/gpu/test_core_gpu.py tests/gpu/test_providers_gpu.py 2>&1 | tail -30 ;;
    random)  # seeded random calls through the public API against the reference, then a few under memcheck
      QBACKEND_RANDOM_CASES=${RANDOM_CASES:-200} COLUMNS=400 timeout 420 python3 -m pytest -q -rf -p no:cacheprovider \
        -W ignore::UserWarning tests/gpu/test_random_cases.py 2>&1 | tail -40
      QBACKEND_RANDOM_CASES=${RANDOM_MEMCHECK_CASES:-10} timeout 300 compute-sanitizer --tool memcheck \
        python3 -m pytest -q -p no:cacheprovider -W ignore::UserWarning tests/gpu/test_random_cases.py 2>&1 | tail -8 ;;
    tcases)  # the random cases of the torch provider alone
      QBACKEND_RANDOM_CASES=${RANDOM_CASES:-200} COLUMNS=400 timeout 400 python3 -m pytest -q -rf -p no:cacheprovider \
        -W ignore::UserWarning -k "torch or reached" tests/gpu/test_random_cases.py 2>&1 | tail -30 ;;
    tpaths)  # what torch's own scaled and integer GEMMs take here, and their costs
      timeout 300 python3 bench/probe_torch_paths.py 2>&1 ;;
    selection)  # the default selection per kind, the torch provider, and the reference, against bf16 torch.mm
      timeout 560 python3 bench/bench_selection.py --out "$OUT" 2>&1 ;;
    marlin)
      timeout 300 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_native_marlin.py 2>&1 | tail -15 ;;
    mbench)
      timeout 400 python3 bench/bench_marlin.py --out "$OUT" 2>&1 | tail -200 ;;
    minilm)  # needs the model folder from tools/export_minilm.py, e.g. carried as .carry/minilm16
      QBACKEND_MINILM_DIR=${QBACKEND_MINILM_DIR:-.carry/minilm16} timeout 300 python3 -m pytest -q -p no:cacheprovider -s -k cuda tests/test_minilm_accuracy.py 2>&1 | grep -E "cosine|passed|failed|Error" ;;
    e2e)
      timeout 500 python3 bench/bench_e2e.py --compile --out "$OUT/e2e_h200.json" 2>&1 | grep -v Warning | tail -60 ;;
    e2e_moe)  # the Qwen3-30B-A3B-shaped MoE decoder, bf16 (torch._grouped_mm) against fp8 (QuantMoE), issue 38
      timeout 450 python3 bench/bench_e2e.py --model moe --out "$OUT/e2e_moe_h200.json" ${E2E_MOE_ARGS:-} 2>&1 | grep -v Warning | tail -60 ;;
    tune)
      timeout 220 python3 bench/bench_scaled_mm.py --tune --ms ${TUNE_MS:-1,16,32,64,128,256,1024,4096,8192} --shapes ${TUNE_SHAPES:-4096:4096,6144:4096,28672:4096,4096:14336,8192:8192,57344:8192} --configs "${TUNE_CONFIGS:-}" --out "$OUT/tune.json" 2>&1 | grep -v "^  " ;;
    ab)  # interleaved A/B of the dispatcher's choice against forced configs, M >= 64
      timeout 300 python3 bench/ab_configs.py --ms ${AB_MS:-64,128,256,512,1024,2048} 2>&1 ;;
    tokens)  # token counts between the tiles: partial tiles against whole ones, and the provider's whole-tile path
      timeout 200 python3 bench/probe_partial_token_tiles.py --ms 36,40,66,72,80,88,96,104 --shapes 4096:14336,8192:8192,6144:4096,10240:8192 2>&1 ;;
    qbench)
      timeout 120 python3 bench/bench_quantize.py --out "$OUT/quantize_h200.json" 2>&1 ;;
    qbackend_bench)  # `qbackend bench` as a user runs it, after its GPU test; the console table is kept
      timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_bench_gpu.py 2>&1 | tail -5
      timeout 240 python3 -m qbackend bench --shapes 4096x4096,28672x4096,8192x8192 --m 1,16,256,4096 \
        --json "$OUT/qbackend_bench_h200.json" --png "$OUT/qbackend_bench_h200.png" 2>&1 | tee "$OUT/qbackend_bench_h200.txt" ;;
    block)  # block-scaled FP8: qbackend against torch's cuBLASLt blockwise, Triton and bf16 (issue grid)
      timeout 560 python3 bench/bench_block_fp8.py --out "$OUT/block_fp8_h200.json" 2>&1 | grep -v Warning ;;
    moe_tests)  # grouped GEMM (both families, every config forced), the API-level grouped and QuantMoE tests,
                # gather / SiLU quantize, streams; memcheck over the malformed-offset, graph and long-row cases
      timeout 150 python3 -m pytest -q -rs -p no:cacheprovider -W ignore::UserWarning tests/gpu/test_grouped_native_gpu.py \
        tests/gpu/test_grouped_gpu.py tests/gpu/test_gather_quantize_gpu.py tests/gpu/test_silu_mul_quantize_gpu.py \
        tests/gpu/test_devices_streams_gpu.py tests/test_native_abi.py 2>&1 | tail -8
      timeout 150 compute-sanitizer --tool memcheck python3 -m pytest -q -p no:cacheprovider -W ignore::UserWarning \
        tests/gpu/test_grouped_native_gpu.py tests/gpu/test_silu_mul_quantize_gpu.py \
        -k "(sm90 and (malformed or graph_replay or as_many)) or 40000 or 4096x2048 or non_finite" 2>&1 | tail -3 ;;
    semantics)  # one semantics everywhere (issue 36): non-finite corpus, threads, bounded caches, fork / spawn
      timeout 200 python3 -m pytest -q -rs -p no:cacheprovider -W ignore::UserWarning tests/gpu/test_nonfinite.py \
        tests/gpu/test_threads.py tests/gpu/test_bounded_state.py tests/gpu/test_fork_spawn.py 2>&1 | tail -8 ;;
    moe)  # MoE expert layers as one grouped GEMM: qbackend against torch's grouped GEMMs and a per-expert loop (issue 38)
      timeout 450 python3 bench/bench_moe.py --out "$OUT" ${MOE_ARGS:-} 2>&1 | grep --line-buffered -v Warning ;;
    qgroup)  # per-token-group (1 x 128) quantize against torch.compile, after its GPU test
      timeout 100 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_native_quantize_group.py 2>&1 | tail -3
      timeout 150 python3 bench/bench_quantize.py --granularity group --out "$OUT/quantize_group_h200.json" 2>&1 ;;
    accumulate)  # accumulate="fast" against "precise": the error bounds, the promoting kernels' tests, both
                 # precise paths timed (the default, cuBLASLt through the torch provider; cutlass forced)
      timeout 120 python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_accumulate_gpu.py 2>&1 | tail -25
      timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_native_scaled_mm.py -k "precise or every_config" 2>&1 | tail -3
      timeout 150 python3 bench/bench_accumulate.py --out "$OUT/accumulate_h200.json" 2>&1
      QBACKEND_PROVIDER=cutlass timeout 150 python3 bench/bench_accumulate.py --out "$OUT/accumulate_cutlass_h200.json" 2>&1 ;;
    qsweep)  # the per-token quantize kernel's vectors per thread: automatic against forced
      timeout 200 python3 bench/bench_quantize.py --sweep 2>&1 ;;
    bench)
      timeout 300 python3 bench/bench_scaled_mm.py --out "$OUT/scaled_mm_h200.json" 2>&1 ;;
    ncu)
      timeout 200 ncu --clock-control none --csv --page raw -k regex:"gemm|device_kernel|nvjet|small_m" --metrics \
        gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size,sm__throughput.avg.pct_of_peak_sustained_elapsed \
        python3 bench/profile_small_m.py > "$OUT/ncu_small_m_raw.csv" 2>&1
      python3 bench/profile_small_m.py --summarize "$OUT/ncu_small_m_raw.csv" > "$OUT/ncu_small_m.csv"; cat "$OUT/ncu_small_m.csv" ;;
    ncu_detail)  # full sections for one small-M point against cuBLASLt
      S="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats --section Occupancy --section SchedulerStats"
      timeout 200 ncu --clock-control none $S -k regex:"device_kernel|nvjet|small_m" python3 bench/profile_small_m.py \
        --points 1:4096:4096 --impls qbackend,tensorwise > "$OUT/ncu_detail_m1_4096x4096_h200.txt" 2>&1 ;;
    ncu_marlin)  # full sections for the marlin sm80 kernel and bf16 torch.mm on three small-M points
      S="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats --section Occupancy --section SchedulerStats --section InstructionStats --section SourceCounters"
      timeout 200 ncu --clock-control none $S --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio \
        -k regex:"marlin_mm|gemm|nvjet" python3 bench/profile_marlin.py \
        > "$OUT/ncu_marlin_h200.txt" 2>&1 ;;
    mtrace)  # the marlin blocks' timelines: a standalone build with the kernel's trace compiled in
      bash csrc_cuda/marlin/build_standalone.sh /tmp/qb_mtrace -DQB_MARLIN_TRACE > /dev/null &&
        timeout 150 python3 bench/probe_marlin.py --lib /tmp/qb_mtrace/libqbackend_marlin_test.so --skip-timing \
          --trace 1:4096:4096,16:4096:4096,1:6144:4096,16:10240:8192,1:28672:4096 2>&1 ;;
    memcheck)
      timeout 240 compute-sanitizer --tool memcheck python3 tests/gpu/memcheck_native.py 2>&1 | tail -8 ;;
    racecheck)  # shared-memory hazards and barrier misuse in the marlin and scaled_mm kernels
      timeout 240 compute-sanitizer --tool racecheck python3 tests/gpu/memcheck_native.py marlin scaled_mm 2>&1 | tail -4
      timeout 240 compute-sanitizer --tool synccheck python3 tests/gpu/memcheck_native.py marlin scaled_mm 2>&1 | tail -4 ;;
    wheel)
      whl=$(ls -t dist/qbackend-*-py3-none-linux_x86_64.whl | head -1)
      echo "wheel: $whl"
      TORCH_SPEC=system timeout 560 bash tools/test_wheel.sh "$whl" -W ignore::UserWarning tests/test_native_abi.py \
        tests/gpu/test_native_quantize.py tests/gpu/test_native_scaled_mm.py tests/gpu/test_native_marlin.py \
        tests/gpu/test_core_gpu.py 2>&1 | tee "$OUT/wheel_gpu_h200.log" | tail -30 ;;
    buildtime)  # throw-away build dirs; CUTLASS from the installed nvidia-cutlass
      for archs in all 90a; do
        rm -rf "/tmp/qb_buildtime_$archs"
        t1=$(date +%s)
        QBACKEND_COMPILER_LAUNCHER=none timeout 540 python3 -m qbackend build --archs "$archs" --jobs 16 \
          --build-dir "/tmp/qb_buildtime_$archs" --dest "/tmp/qb_buildtime_$archs/lib" 2>&1 | grep -E "^qbackend|error"
        echo "buildtime: --archs $archs --jobs 16 on $(nproc) cores: $(( $(date +%s) - t1 )) s"
      done 2>&1 | tee "$OUT/buildtime_h200.log" ;;
  esac
  echo "== step $step took $(( $(date +%s) - t0 )) s"
done
