# One-row float products whose programs load all their weights before the wait for the
# previous kernel (gemv_triton.gemv_early, the default; ENGINE_GEMV_EARLY=0 the kernel before),
# on the GPU machine (from the repository root, carrying .whl and .whl-server). Each step's log
# lands in $OUT.
#     bash benchmarks/early_check_gpu.sh [STEP...]   (steps: checks chain e2e moe quant;
#     profile: where batch 1's step goes, with PDL on; where: the MoE and fp8 models' steps;
#     tall: q/k/v's one-row launch against the square one; tall_final: int8's q/k/v launches,
#     the 8-bit and 4-bit formats at 1 and 32 rows, the swapped kernel's GPU tests;
#     codes: one row's swapped product with the activations handed over as codes, per layer
#     against the product that quantizes them itself, and a launch search; row_layout: the
#     one-row swapped kernel with its row stored whole into the padded operand: checks, the
#     step, a launch search and the step at its launches; step_search: the one-row launches
#     chosen by the step's time; cvt: one row's fp8 codes rounded by the conversion
#     instruction, checks and the step; static_epilogue: the row epilogue with static
#     scales, A/B, a step search with it, the fp8 model; final_quant: GPU checks of the
#     quantized products, the step, the fp8 model; swap_tests: the swapped kernel's GPU
#     checks (once a call, whichever step asks first); block_search: block fp8's one-row
#     launches chosen by the step, then A/B against the shipped ones; block_rows: block
#     fp8's launches from that search against those before, at 1-16 rows; even: whole
#     tiles loaded without masks (ENGINE_SWAP_EVEN=1) and weight tiles through tensor
#     descriptors (ENGINE_SWAP_TMA=1), checks and the four combinations; lean_search: a step
#     search with both on (now the defaults); group_ab: block fp8's rows quantized first, A/B
#     alone; block_tma: block fp8's weight tiles through tensor descriptors, A/B;
#     scales_ahead: block fp8's scales loaded an iteration ahead, checks and A/B;
#     late_scale: one row's dynamic scale taken after the first weight tiles are asked for,
#     A/B; quant_ab: the GPU checks once, then block_tma's and late_scale's A/Bs;
#     moe_overlap: the MoE model at batch 1 with the next step built during this one;
#     moe_even: the one-token down projection over unrolled whole tiles, alone and in the model;
#     decode_sweep: the decode kernel's launch at batch 1 in the MoE model's profile;
#     token_down: one token's down projection through all its pairs with their combine, GPU
#     checks and the model A/B; next_call: that, the decode kernel at 8 warps, and on an H200
#     the fp8 step, in one call; stream: the packed words' streaming rate by layout
#     (benchmarks/stream_layout_gpu.py); compact: the packed weights' scales and biases in 16
#     bits against float32, GPU checks and the gptq/awq step A/B; affine_launches: the
#     swapped 4-bit kernel's one-row launches given in AFFINE_LAUNCHES against the shipped
#     ones (layers, then the step twice); eight_cols: the same at the shipped launches with
#     the groups in eight columns (XSUM 3); pdl_ab: the bf16 and gptq/awq steps with PDL on
#     and off; w4_bound: the 4-bit step's words streamed alone in its order (a bound), and
#     the shipped step (and layers); w4_floor: the one-row 4-bit products' own floor, their
#     words from the L2 (benchmarks/w4_floor_gpu.py); w4_forms: the gptq/awq step with each
#     one-row form (shipped, eight columns, the Gluon kernel from registers and staged);
#     nibbles: gemv_nibbles' GPU checks, layers (NIB_LAUNCHES) and the step without it, as
#     shipped and with the layers where it won;
#     gemv_mma: one row of bf16 weights through mma.sync from registers, checks and us;
#     moe_mma: one token's MoE projections on the matrix unit: checks, model A/B, chain;
#     second_call: gemv_mma then moe_mma (the call after first_call); h200_now, h200_then: two
#     calls on an H200 (moe_mma's checks and model A/B, fp8's step; the 4-bit step with and
#     without gemv_nibbles, gemv_mma, moe_mma's chain);
#     first_call: on an H200 gemv_nibbles' GPU checks, the fp8 step, the 4-bit step with and
#     without gemv_nibbles, the one-token down A/B and nibbles' layers, on
#     another card the nibbles step (one call of ~9 minutes, whichever card comes);
#     h200_a, h200_b: on an H200, the next two calls there (a: block and per-tensor
#     fp8's step, then compact; b: the one-token down and 4-bit route A/Bs);
#     h200_targets: on an H200 only, the figures of the open targets, shortest first;
#     h200_next: on an H200 only, the open questions there, most telling first (fp8 targets,
#     the gate/up-only 4-bit route, the decode kernel at 8 warps, the MoE down projection);
#     w4_sync: one row of 4-bit codes at 16-32 outputs a program; group_codes: block
#     fp8's rows quantized first, A/B and a step search; ncu:
#     Nsight Compute's counters for the one-row products and the one-token MoE layer;
#     int4pack: 4-bit products through PyTorch's own int4 kernel against ours (int4pack_step:
#     its GPU tests and the step A/B alone); moe_hints,
#     moe_hints_model: the experts' weights read with L2 cache hints, A/B (layer; model);
#     moe_wide, moe_narrow: one-token expert launches with few outputs a program and whole-row
#     tiles (a sweep in the chain of layers, then the model with the fastest); moe_one_token:
#     the shipped launch's GPU checks, profile and model; moe_residual: the residual added in
#     the combine, A/B; moe_final: the MoE step's profile, then moe_residual;
#     ncu_moe: Nsight Compute's sections for the one-token MoE layer's kernels alone; ncu_attn:
#     the same for the MoE model's decode attention kernels at batch 1;
#     moe_onewarp: one-warp one-token launches in the chain; group_bound: the block fp8 step as
#     shipped, with the inputs the decoder hands over, and without quantization (a bound);
#     targets: the step of the formats with a target, as shipped (fp8 block and per tensor,
#     gptq and awq with one row on the gemv and on the swapped kernel);
#     affine_cols: one row of 4-bit codes with the groups in the product's columns;
#     affine_mma: one row of 4-bit codes on the matrix unit from registers (Gluon): checks,
#     launches per layer, the gptq/awq step with it off and on; affine_stages: the same
#     kernel with its words through stages of shared memory; affine_route: the fused gate/up
#     weight's one row alone through that kernel at 4 stages, the step A/B and a launch sweep;
#     producer_codes: block fp8's inputs as group codes from the norm and SiLU kernels, checks
#     and the model A/B;
#     ncu_source: per-instruction counters (SASS, stall samples) of the MoE projections and
#     the one-row 4-bit product, as CSV;
#     topk_profile: the router's top-k's GPU checks and the MoE step's profile;
#     sparse_chain: the MoE model at batch 1 with its layers' attention half chained, A/B;
#     layer: the chained one-row layer (gemv_triton.gemv_chain, the default; ENGINE_GEMV_CHAIN=0
#     off; chain_profile, chain_default the later runs): its
#     checks, the step's products with the small kernels against the chain, decode at batch 1)
source benchmarks/gpu_env.sh >/dev/null 2>&1 || { echo "gpu_env.sh failed"; exit 1; }
OUT=${OUT:-/tmp/early_check}
source benchmarks/gpu_step.sh
ncu_bin() {  # Nsight Compute's command line: on the PATH, else the first install found
  command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1
}
swap_tests() {  # the swapped 8-bit kernel's GPU checks (every form on and off), once a call
  [ -n "$SWAP_TESTED" ] && return
  SWAP_TESTED=1
  TAIL=3 step 150 swap_tests python3 -m pytest -q -p no:cacheprovider -m gpu \
    tests/runtime/test_swap_kernels.py
}
ab_block_tma() {  # block fp8's weight tiles through tensor descriptors (the default since
  # 2026-12-05) against pointer loads (ENGINE_SWAP_TMA=0), at 1, 4 and 16 rows, twice
  for r in 1 2; do
    for v in 0 d; do
      if [ $v = 0 ]; then export ENGINE_SWAP_TMA=0; else unset ENGINE_SWAP_TMA; fi
      TAIL=3 step 60 "block_tma_${v}_$r" python3 benchmarks/quant_gpu.py --batches 1,4,16 \
        --schemes fp8_block
    done
  done
  unset ENGINE_SWAP_TMA
}
w4_step() {  # NAME: the gptq/awq step at one row, codes packed (the caller's environment)
  ENGINE_PACKED_WEIGHT_ONLY=1 TAIL=${TAIL:-4} step 90 "$1" python3 benchmarks/quant_gpu.py \
    --batches 1 --schemes gptq,awq
}
w4_route_step() {  # NAME ROUTE: the gptq/awq step at one row with ENGINE_AFFINE_MMA_ROUTE=ROUTE
  # ("": every product as shipped)
  ENGINE_AFFINE_MMA_ROUTE=$2 TAIL=3 w4_step "$1"
}
# the shipped one-row launches with the groups in eight columns (XSUM 3), as
# ENGINE_AFFINE_LAUNCHES entries
COLS8_LAUNCHES="wide:1=64,1,4,2,3;square:1=128,8,4,2,3;deep:1=128,8,4,5,3"
launches_ab() {  # TABLE: the swapped 4-bit kernel's one-row launches of TABLE
  # (ENGINE_AFFINE_LAUNCHES entries) against the shipped ones: the layers at those launches
  # (their correctness on the real shapes first), then the gptq/awq step, twice
  TAIL=14 step 120 launches_layers env ENGINE_AFFINE_LAUNCHES="$1" python3 \
    benchmarks/swap_affine_gpu.py --rows 1 --layers qkv,gate_up,o,down
  local r v l
  for r in 1 2; do
    for v in shipped listed; do
      l=$1
      [ $v = shipped ] && l=""
      ENGINE_AFFINE_LAUNCHES=$l TAIL=3 w4_step "launches_${v}_$r"
    done
  done
}
compact_ab() {  # the gptq/awq step's A/B of the packed weights' scales and biases in 16 bits
  # (quant_methods.compact_constants, the default: 1) against float32 (0): the affine
  # kernels' GPU checks (COMPACT_TESTS=0: none), then the step with each, twice
  # (COMPACT_VARIANTS: others)
  [ "${COMPACT_TESTS:-1}" = 0 ] || TAIL=3 step 200 compact_tests python3 -m pytest -q \
    -p no:cacheprovider -m gpu tests/runtime/test_swap_affine.py
  local r v
  for r in 1 2; do
    for v in ${COMPACT_VARIANTS:-1 0}; do
      ENGINE_AFFINE_COMPACT=$v w4_step "compact_${v}_$r"
    done
  done
}
token_ab() {  # LIMIT RUNNERS: the one-token down launch's GPU checks (once a call), then the
  # MoE model at batch 1 with each runner (moe_gpu.py's triton+token variants)
  if [ -z "$TOKEN_CHECKED" ]; then
    TOKEN_CHECKED=1
    TAIL=4 step 150 token_checks python3 tests/moe/token_moe_checks.py cuda
  fi
  TAIL=12 step "$1" token_model python3 benchmarks/moe_gpu.py --skip kit,kernel,chain \
    --batches 1 --overlap --runners "$2"
}
nib_tests() {  # gemv_nibbles' GPU checks (its routing included)
  TAIL=4 step 100 nib_tests python3 -m pytest -q -p no:cacheprovider -m gpu \
    tests/runtime/test_nibbles_triton.py
}
nib_bench() {  # LIMIT: each layer at the launches NIB_LAUNCHES (default: the benchmark's)
  # against the step route without gemv_nibbles; the fastest winning launches go to
  # $OUT/nib_best.txt as ENGINE_W4_NIBBLES's value
  TAIL=40 step "$1" nib_layers python3 benchmarks/nibbles_gpu.py \
    --write-best "$OUT/nib_best.txt" ${NIB_LAUNCHES:+--launches "$NIB_LAUNCHES"}
}
nib_layers() {  # LIMIT: nib_tests, then nib_bench LIMIT
  nib_tests
  nib_bench "$1"
}
decode_profiles() {  # PREFIX LAUNCH...: the MoE model's batch-1 profile with each decode
  # launch (ENGINE_TRITON_DECODE_LAUNCH=BLOCK_N,warps,stages), its attention rows printed
  local prefix=$1 c
  shift
  for c in "$@"; do
    ENGINE_TRITON_DECODE_LAUNCH=$c TAIL=0 step 150 "${prefix}_$c" python3 \
      benchmarks/profile_decode_gpu.py --batch 1 --steps 20 \
      --model-dir tests/data/qwen3-30b-a3b-dummy --no-kernel-table
    grep -E "step .* ms wall|the chain|_decode|_qk|norm" "$OUT/${prefix}_$c.log" | head -8
  done
}
ab_scales_ahead() {  # block fp8's scales loaded an iteration ahead (ENGINE_SWAP_SCALES_AHEAD=1),
  # at 1, 4 and 16 rows, twice
  for r in 1 2; do
    for v in 0 1; do
      ENGINE_SWAP_SCALES_AHEAD=$v TAIL=3 step 60 "scales_ahead_${v}_$r" python3 \
        benchmarks/quant_gpu.py --batches 1,4,16 --schemes fp8_block
    done
  done
}
ab_late_scale() {  # one row's dynamic scale taken after the first weight tiles are asked for
  # (ENGINE_SWAP_LATE_SCALE=1): dynamic per-row fp8 and int8, static fp8 as the control, twice
  for r in 1 2; do
    for v in 0 1; do
      ENGINE_SWAP_LATE_SCALE=$v TAIL=5 step 60 "late_scale_${v}_$r" python3 \
        benchmarks/quant_gpu.py --batches 1 --schemes fp8_tensor,ct_fp8_dynamic,ct_w8a8_int8
    done
  done
}
ab_moe_profile() {  # where the MoE model's batch-1 step goes with the variable $1 at $2 and at
  # $3, alternating twice (logs $4_VALUE_ROUND)
  for r in 1 2; do
    for v in "$2" "$3"; do
      export "$1=$v"
      TAIL=30 step 120 "${4}_${v}_$r" python3 benchmarks/profile_decode_gpu.py --batch 1 \
        --steps 20 --model-dir tests/data/qwen3-30b-a3b-dummy --no-kernel-table
    done
  done
  unset "$1"
}
int4pack_steps() {  # the int4 layout's GPU tests, then the gptq / awq step with the layout
  # (ENGINE_W4_INT4PACK=1) and without, twice
  TAIL=3 step 120 int4pack_tests python3 -m pytest -q -p no:cacheprovider -m gpu \
    tests/quant/test_int4pack.py
  for r in 1 2; do
    for v in 0 1; do
      ENGINE_PACKED_WEIGHT_ONLY=1 ENGINE_W4_INT4PACK=$v TAIL=5 step 120 \
        "int4pack_step_${v}_$r" python3 benchmarks/quant_gpu.py --batches 1,32 \
        --schemes gptq,awq
    done
  done
}
steps=("${@:-checks chain e2e moe quant}")
for s in ${steps[*]}; do
  case $s in
    checks)
      TAIL=9 step 60 shapes python3 -c '
import torch
from engine.runtime import gemv_triton as gt
for n, k in ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128, 2048),
             (5120, 2048), (2048, 4096), (151936, 2048)):
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    y, want = gt.gemv(x, w).double(), x.double() @ w.double().t()
    print(n, k, "rel err", f"{((y - want).abs().max() / want.abs().max()).item():.2e}")'
      TAIL=3 step 120 pdl_tests python3 -m pytest -q -p no:cacheprovider -m gpu \
        tests/runtime/test_triton_pdl.py tests/runtime/test_fused_kernels.py ;;
    chain) TAIL=12 step 120 chain python3 benchmarks/step_products_gpu.py --variants \
      "default,early,early:deep=2x16384x8,early:deep=4x2048x4,early:deep=16x1024x8,early:square=8x4096x8+wide=8x4096x8,early:wide=2x4096x4,default,early" ;;
    e2e) TAIL=6 step 200 e2e python3 benchmarks/e2e_gpu.py \
      --backends triton,triton:late,triton,triton:late --batches 1 --hf "" --steps 32 ;;
    moe) TAIL=6 step 150 moe python3 benchmarks/moe_gpu.py --skip kit,kernel,chain \
      --batches 1 --runners triton ;;
    profile) TAIL=60 step 150 profile python3 benchmarks/profile_decode_gpu.py --batch 1 \
      --steps 20 ;;
    chain_profile)  # the chained layer: where its step goes, products and decode A/B
      TAIL=28 step 150 chain_profile python3 benchmarks/profile_decode_gpu.py --batch 1 \
        --steps 20
      TAIL=6 step 120 chain_products python3 benchmarks/step_products_gpu.py --small \
        --variants early,chain,early,chain
      TAIL=5 step 200 chain_e2e python3 benchmarks/e2e_gpu.py --backends \
        triton:unchained,triton --batches 1 --hf "" --steps 32 ;;
    preload)  # the decode kernel's first key tile read before its wait: GPU tests, A/B
      TAIL=3 step 200 attn_tests python3 -m pytest -q -p no:cacheprovider -m gpu \
        tests/attention/test_triton_attention.py tests/runtime/test_triton_pdl.py
      TAIL=14 step 300 preload_e2e python3 benchmarks/e2e_gpu.py --backends \
        triton,triton:nopreload --batches 1,32 --hf "" --steps 32 --overlap ;;
    final)  # the session's end state: chain checks, PDL tests, the MoE kit, decode at batch 1
      TAIL=3 step 150 layer_checks python3 tests/runtime/fused_gemv_checks.py cuda
      TAIL=3 step 150 pdl_tests python3 -m pytest -q -p no:cacheprovider -m gpu \
        tests/runtime/test_triton_pdl.py tests/runtime/test_fused_kernels.py
      TAIL=8 step 150 moe_kit python3 benchmarks/moe_gpu.py --skip kernel,chain,model
      TAIL=8 step 200 final_e2e python3 benchmarks/e2e_gpu.py --backends \
        triton,triton:unchained --batches 1 --hf "" --steps 32 --overlap ;;
    where)  # where the MoE model's and the fp8 model's batch-1 steps go, with PDL on
      TAIL=30 step 120 moe_profile python3 benchmarks/profile_decode_gpu.py --batch 1 \
        --steps 20 --model-dir tests/data/qwen3-30b-a3b-dummy --no-kernel-table
      TAIL=30 step 120 fp8_profile python3 benchmarks/profile_decode_gpu.py --batch 1 \
        --steps 20 --quantization fp8 --no-kernel-table ;;
    tall)  # q/k/v's own one-row launch (swap_triton "tall") against the square one
      W8=fp8_tensor,ct_fp8_dynamic,modelopt_fp8,ct_w8a8_int8
      TAIL=6 step 90 w8_tall python3 benchmarks/quant_gpu.py --batches 1 --schemes $W8
      ENGINE_SWAP_TALL=0 TAIL=6 step 90 w8_square python3 benchmarks/quant_gpu.py --batches 1 \
        --schemes $W8 ;;
    tall_final)  # int8's q/k/v launch, the shipped state's table, the swapped kernel's GPU tests
      TAIL=4 step 120 int8_qkv python3 benchmarks/swap_gpu.py --search --formats int8 --rows 1 \
        --layers qkv --splits 2,4 --block-k 256 --stages 4
      ENGINE_PACKED_WEIGHT_ONLY=1 TAIL=9 step 200 w8_final python3 benchmarks/quant_gpu.py \
        --batches 1,32 --schemes fp8_tensor,ct_fp8_dynamic,modelopt_fp8,fp8_block,ct_w8a8_int8,gptq
      TAIL=3 step 150 swap_tests python3 -m pytest -q -p no:cacheprovider -m gpu \
        tests/runtime/test_swap_kernels.py ;;
    codes)  # one row's product with its activations handed over as codes (made before)
      TAIL=3 step 150 swap_tests python3 -m pytest -q -p no:cacheprovider -m gpu \
        tests/runtime/test_swap_kernels.py
      TAIL=30 step 300 codes python3 benchmarks/swap_gpu.py --search --formats \
        fp8,fp8_codes,int8_codes --rows 1 --splits 1,2,4 --block-k 256,512 --stages 3,4 ;;
    row_layout)  # one row's operand stored whole (matrix stores): checks, the step twice, then a
      # launch search at one row and the step at the searched launches
      TAIL=3 step 150 swap_tests python3 -m pytest -q -p no:cacheprovider -m gpu \
        tests/runtime/test_swap_kernels.py
      TAIL=3 step 120 sm90_build python3 -m pytest -q -p no:cacheprovider \
        tests/runtime/test_sm90_compile.py -k swap
      W8=fp8_tensor,ct_fp8_dynamic,modelopt_fp8,fp8_block,ct_w8a8_int8
      for r in 1 2; do
        TAIL=7 step 90 "row_layout_$r" python3 benchmarks/quant_gpu.py --batches 1 --schemes $W8
      done
      TAIL=12 step 240 row_layout_search python3 benchmarks/swap_gpu.py --search --formats \
        fp8,int8 --rows 1 --splits 1,2,4 --block-k 256,512 --stages 3,4 \
        --write-launches "$OUT/row_layout.json"
      TAIL=7 step 90 row_layout_searched python3 benchmarks/quant_gpu.py --batches 1 \
        --schemes $W8 --launches "$OUT/row_layout.json" ;;
    cvt)  # one row's fp8 codes rounded by the conversion instruction alone: checks, the step
      TAIL=3 step 150 swap_tests python3 -m pytest -q -p no:cacheprovider -m gpu \
        tests/runtime/test_swap_kernels.py
      W8=fp8_tensor,ct_fp8_dynamic,modelopt_fp8,fp8_block,ct_w8a8_int8
      for r in 1 2; do
        TAIL=7 step 90 "cvt_$r" python3 benchmarks/quant_gpu.py --batches 1 --schemes $W8
      done ;;
    static_epilogue)  # the row epilogue with static scales too (ENGINE_SWAP_ROW_EPILOGUE=1), A/B,
      # a step search with it, the fp8 model at batch 1
      W8=fp8_tensor,ct_fp8_dynamic,modelopt_fp8,fp8_block,ct_w8a8_int8
      for v in default 1 default 1; do
        if [ $v = 1 ]; then export ENGINE_SWAP_ROW_EPILOGUE=1; fi
        TAIL=7 step 90 "static_epilogue_$v" python3 benchmarks/quant_gpu.py --batches 1 \
          --schemes $W8
        unset ENGINE_SWAP_ROW_EPILOGUE
      done
      ENGINE_SWAP_ROW_EPILOGUE=1 TAIL=60 step 330 epilogue_search python3 \
        benchmarks/quant_gpu.py --step-search fp8_tensor --write-launches "$OUT/epilogue.json"
      TAIL=8 step 200 fp8_e2e python3 benchmarks/e2e_gpu.py --backends triton --batches 1 \
        --quantization fp8 --hf "" --steps 32 --rounds 2 ;;
    even)  # whole tiles loaded without masks (ENGINE_SWAP_EVEN=1) and weight tiles through
      # tensor descriptors (ENGINE_SWAP_TMA=1): GPU checks, the step, the four combinations twice
      TAIL=3 step 150 swap_tests python3 -m pytest -q -p no:cacheprovider -m gpu \
        tests/runtime/test_swap_kernels.py
      W8=fp8_tensor,ct_fp8_dynamic,modelopt_fp8,fp8_block,ct_w8a8_int8
      for r in 1 2; do
        for v in 00 10 01 11; do
          ENGINE_SWAP_EVEN=${v:0:1} ENGINE_SWAP_TMA=${v:1:1} TAIL=7 step 90 "even_tma_${v}_$r" \
            python3 benchmarks/quant_gpu.py --batches 1 --schemes $W8
        done
      done ;;
    group_codes)  # block fp8's rows quantized first (ENGINE_SWAP_GROUP_CODES=1): A/B, then
      # block fp8's launches chosen by the step with it
      TAIL=3 step 150 swap_tests python3 -m pytest -q -p no:cacheprovider -m gpu \
        tests/runtime/test_swap_kernels.py
      for v in 0 1 0 1; do
        ENGINE_SWAP_GROUP_CODES=$v TAIL=3 step 60 "group_codes_$v" python3 \
          benchmarks/quant_gpu.py --batches 1,4,16 --schemes fp8_block
      done
      ENGINE_SWAP_GROUP_CODES=1 TAIL=40 step 200 group_codes_search python3 \
        benchmarks/quant_gpu.py --step-search fp8_block --write-launches "$OUT/group.json" ;;
    lean_search)  # the one-row launches chosen by the step with whole tiles unmasked and fp8
      # weight tiles through tensor descriptors (the defaults) and 8 warps on 64 outputs among
      # the candidates, then the step with them
      W8=fp8_tensor,ct_fp8_dynamic,modelopt_fp8,fp8_block,ct_w8a8_int8
      TAIL=70 step 240 lean_search python3 benchmarks/quant_gpu.py --step-search fp8_tensor \
        --write-launches "$OUT/lean.json"
      TAIL=7 step 90 lean_searched python3 benchmarks/quant_gpu.py --batches 1 \
        --schemes $W8 --launches "$OUT/lean.json" ;;
    group_ab)  # block fp8's rows quantized first (ENGINE_SWAP_GROUP_CODES=1) against the
      # product that quantizes each tile, at 1, 4 and 16 rows, twice
      for v in 0 1 0 1; do
        ENGINE_SWAP_GROUP_CODES=$v TAIL=3 step 60 "group_codes_$v" python3 \
          benchmarks/quant_gpu.py --batches 1,4,16 --schemes fp8_block
      done ;;
    block_tma) ab_block_tma ;;  # block fp8's weight tiles through descriptors, A/B
    scales_ahead) swap_tests; ab_scales_ahead ;;  # block fp8's scales an iteration ahead
    late_scale) swap_tests; ab_late_scale ;;  # one row's dynamic scale after the first tiles
    quant_ab) swap_tests; ab_block_tma; ab_late_scale ;;  # both, one call
    moe_even)  # the one-token down projection over unrolled whole tiles (even_down): the
      # launches alone (weights in L2 / in memory / after the up projection), the runner kit on
      # CUDA, then the model at batch 1 against the whole-row launch (triton+noeven), twice
      TAIL=24 step 200 moe_down python3 benchmarks/moe_down_gpu.py --variants \
        ${MOE_DOWN_VARIANTS:-p16x128x4,n16x128x4,16x128x2,32x128x4,16x64x4,u2x2048x4,u4x2048x4,u8x2048x8,u4x1024x4,u8x1024x4,u2x1024x2}
      TAIL=6 step 200 moe_kit python3 benchmarks/moe_gpu.py --skip kernel,chain,model \
        --runners triton
      TAIL=10 step 400 moe_even_model python3 benchmarks/moe_gpu.py --skip kit,kernel,chain \
        --batches 1 --runners triton,triton+noeven,triton,triton+noeven --overlap ;;
    token_down)  # one token's down projection through all its pairs with their combine
      # (ENGINE_MOE_TOKEN_DOWN): its GPU checks, then the model at batch 1 against the pair
      # launches + combine kernel (TOKEN_RUNNERS: other launches, e.g. triton+token2)
      token_ab 420 "${TOKEN_RUNNERS:-triton,triton+token,triton+tokenp,triton,triton+token}" ;;
    next_call)  # the open questions in one call of ~9 minutes, on either card: the one-token
      # down launch with its combine (checks, model A/B), the decode kernel at 4 and 8 warps in
      # the MoE step's profile; on an H200 also block and per-tensor fp8's step (H100: the
      # token_down A/B takes two more launches instead)
      if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
        token_ab 240 triton,triton+token,triton,triton+token
        TAIL=4 step 90 next_fp8 python3 benchmarks/quant_gpu.py --batches 1 \
          --schemes fp8_block,fp8_tensor --model-inputs
      else
        token_ab 320 triton,triton+token,triton+token2,triton,triton+token,triton+token8
      fi
      decode_profiles next_decode 64,4,3 64,8,3 ;;
    compact)  # the 16-bit constants' A/B (compact_ab)
      compact_ab ;;
    affine_launches)  # the swapped 4-bit kernel's one-row launches of AFFINE_LAUNCHES
      # (ENGINE_AFFINE_LAUNCHES entries, e.g. from affine_cols_search on this card) against
      # the shipped table: the layers at those launches, then the gptq/awq step, twice
      launches_ab "$AFFINE_LAUNCHES" ;;
    eight_cols)  # the shipped one-row launches with the groups in eight columns (XSUM 3)
      launches_ab "$COLS8_LAUNCHES" ;;
    nibbles)  # gemv_nibbles (one row of 4-bit codes on the CUDA cores): nib_layers, then the
      # gptq/awq step without it (ENGINE_W4_NIBBLES=0), as shipped (q/k/v and o through it) and
      # with the layers whose fastest launch won, alternating twice
      nib_layers 200
      spec=$(cat "$OUT/nib_best.txt" 2>/dev/null)
      echo "ENGINE_W4_NIBBLES=$spec"
      for r in 1 2; do
        ENGINE_W4_NIBBLES=0 w4_step "nib_off_$r"
        w4_step "nib_shipped_$r"
        [ -n "$spec" ] && ENGINE_W4_NIBBLES=$spec w4_step "nib_routed_$r"
      done ;;
    gemv_mma)  # one row of bf16 weights on the matrix unit (benchmarks/gemv_mma_gpu.py: the
      # MoE down projection's shape and the dense ones) against the bf16 gemv and cuBLAS
      TAIL=40 step 120 gemv_mma python3 benchmarks/gemv_mma_gpu.py ;;
    moe_mma)  # one token's expert projections on the matrix unit (token_mma; ENGINE_MOE_DOWN_MMA,
      # ENGINE_MOE_UP_MMA): GPU checks (token_moe_checks.py), the MoE model at batch 1 A/B,
      # then the chain of 8 layers with each of its launches beside the shipped one
      token_ab 330 triton,triton+mma,triton+mmaup,triton+mmanopf,triton,triton+mmaup
      TAIL=14 step 150 mma_chain python3 benchmarks/moe_gpu.py --skip kit,kernel,model \
        --chain-tokens 1 --wide-sweep mma ;;
    second_call)  # after first_call on an H200: the matrix unit's forms (gemv_mma's probe,
      # then moe_mma), ~6 minutes
      bash "$0" gemv_mma moe_mma ;;
    h200_now)  # one call (~9 minutes) on an H200: the MoE projections on the matrix unit (GPU
      # checks, the model at batch 1 A/B), then block and per-tensor fp8's step
      token_ab 390 triton,triton+mma,triton+mmaup,triton+mmanopf,triton,triton+mmaup
      TAIL=8 step 100 now_fp8 python3 benchmarks/quant_gpu.py --batches 1 \
        --schemes fp8_block,fp8_tensor --model-inputs ;;
    h200_then)  # the call after h200_now: the 4-bit step with and without gemv_nibbles, the
      # bf16 probe on the matrix unit, the chain of MoE launches
      w4_step then_w4
      ENGINE_W4_NIBBLES=0 w4_step then_w4_off
      bash "$0" gemv_mma
      TAIL=14 step 150 mma_chain python3 benchmarks/moe_gpu.py --skip kit,kernel,model \
        --chain-tokens 1 --wide-sweep mma ;;
    w4_forms)  # the gptq/awq step at one row with each one-row form, alternating twice: as
      # shipped (q/k/v and o through gemv_nibbles), without gemv_nibbles (off), and, without
      # it too, the groups in eight columns (XSUM 3), the Gluon kernel from registers
      # (ENGINE_AFFINE_MMA=1) and through 4 stages of shared memory: fewer instructions a
      # weight, which an H200 (bound by them where an H100 is bound by its bytes) can show
      # (W4_FORMS: a subset of shipped off cols8 mma mma4)
      for r in 1 2; do
        for f in ${W4_FORMS:-shipped off cols8 mma mma4}; do
          case $f in
            shipped) w4_step "w4f_shipped_$r" ;;
            cols8) ENGINE_W4_NIBBLES=0 ENGINE_AFFINE_LAUNCHES=$COLS8_LAUNCHES TAIL=3 \
              w4_step "w4f_cols8_$r" ;;
            mma) ENGINE_W4_NIBBLES=0 ENGINE_AFFINE_MMA=1 TAIL=3 w4_step "w4f_mma_$r" ;;
            mma4) ENGINE_W4_NIBBLES=0 ENGINE_AFFINE_MMA=1 ENGINE_AFFINE_MMA_STAGES=4 TAIL=3 \
              w4_step "w4f_mma4_$r" ;;
            off) ENGINE_W4_NIBBLES=0 TAIL=3 w4_step "w4f_off_$r" ;;
          esac
        done
      done ;;
    pdl_ab)  # what PDL gives the bf16 and gptq/awq steps at one row (ENGINE_PDL 1 / 0,
      # alternating twice): whether the 4-bit products overlap their neighbours as the bf16
      # ones do
      for r in 1 2; do
        for v in 1 0; do
          ENGINE_PDL=$v w4_step "pdl_${v}_$r"
        done
      done ;;
    w4_bound)  # the 4-bit step's words streamed alone in the step's order, kernels chained
      # by PDL, loads after / first tiles before / all before the wait (a bound for any
      # one-row 4-bit kernel of this launch sequence), then the shipped gptq/awq step and
      # the shipped products per layer alone
      TAIL=22 step 240 w4_bound python3 benchmarks/w4_bound_gpu.py
      w4_step w4_bound_step
      TAIL=14 step 120 w4_bound_layers python3 benchmarks/swap_affine_gpu.py --rows 1 \
        --layers qkv,gate_up,o,down ;;
    w4_floor)  # the one-row 4-bit products with their words from memory, from the L2 (the
      # same weight again) and with every row reading one packed row (the kernels' floor)
      TAIL=12 step 200 w4_floor python3 benchmarks/w4_floor_gpu.py ;;
    h200_a)  # an H200 call of ~6 minutes: block and per-tensor fp8's step with the inputs
      # the decoder hands over, then compact without its GPU checks (h200_b the next call)
      nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || {
        echo "not an H200: h200_a skipped"; continue; }
      TAIL=4 step 90 h200_fp8 python3 benchmarks/quant_gpu.py --batches 1 \
        --schemes fp8_block,fp8_tensor --model-inputs
      COMPACT_TESTS=0 compact_ab ;;
    first_call)  # one call of ~9 minutes for whichever card comes: on an H200 gemv_nibbles'
      # checks, block and per-tensor fp8's step with the decoder's inputs, the 4-bit step with
      # and without gemv_nibbles, the one-token down launch's A/B in the MoE model, then
      # gemv_nibbles' layers; on another card the nibbles step whole
      export NIB_LAUNCHES=${NIB_LAUNCHES:-"64,2,0,4,4,0;64,2,0,4,4,1;64,1,0,4,4,1;\
128,2,0,8,4,1;128,2,0,4,4,1;64,2,0,2,4,1"}
      if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
        nib_tests
        TAIL=8 step 100 first_fp8 python3 benchmarks/quant_gpu.py --batches 1 \
          --schemes fp8_block,fp8_tensor --model-inputs
        w4_step first_w4
        ENGINE_W4_NIBBLES=0 w4_step first_w4_off
        token_ab 240 triton,triton+token,triton,triton+token
        nib_bench 150
      else
        exec bash "$0" nibbles
      fi ;;
    h200_b)  # the MoE model at batch 1 with the one-token down launch (A/B twice), the
      # gptq/awq step with gate/up alone through the staged kernel (A/B once)
      token_ab 240 triton,triton+token,triton,triton+token
      w4_route_step h200_w4_shipped ""
      w4_route_step h200_w4_route 28672x4096:1,4,4,1,1,1,1,4 ;;
    stream)  # the packed 4-bit words streamed as the one-row kernels read them, and a tile a run
      TAIL=25 step 120 stream python3 benchmarks/stream_layout_gpu.py
      TAIL=12 step 120 stream_k14336 python3 benchmarks/stream_layout_gpu.py --n 4096 \
        --k 14336 --configs 64x32x2x4,64x32x4x4,16x32x4x4,8x256x1x8,8x128x2x4 ;;
    h200_targets)  # what an H200 call should take first, shortest first: the MoE model at batch
      # 1 with the whole-tile down projection against the whole-row one, then the quantized
      # steps of every format with a target (the targets step), then where the MoE step goes
      nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || {
        echo "not an H200: h200_targets skipped"; continue; }
      TAIL=10 step 300 moe_even_model python3 benchmarks/moe_gpu.py --skip kit,kernel,chain \
        --batches 1 --runners triton,triton+noeven,triton,triton+noeven --overlap
      for r in 1 2; do
        TAIL=4 step 90 "targets_fp8_$r" python3 benchmarks/quant_gpu.py --batches 1 \
          --schemes fp8_block,fp8_tensor --model-inputs
        w4_step "targets_w4_$r"
      done
      TAIL=30 step 120 moe_profile python3 benchmarks/profile_decode_gpu.py --batch 1 \
        --steps 20 --model-dir tests/data/qwen3-30b-a3b-dummy --no-kernel-table ;;
    h200_next)  # the open H200 questions, most telling first, each short: block and per-tensor
      # fp8's step (twice), the gptq/awq step shipped and with gate/up alone through the
      # staged Gluon kernel (twice), the MoE model's decode kernel at 4 and 8 warps, then
      # the MoE model with the whole-tile down projection against the whole-row one
      nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || {
        echo "not an H200: h200_next skipped"; continue; }
      for r in 1 2; do
        TAIL=4 step 90 "next_fp8_$r" python3 benchmarks/quant_gpu.py --batches 1 \
          --schemes fp8_block,fp8_tensor --model-inputs
        w4_route_step "next_w4_shipped_$r" ""
        w4_route_step "next_w4_route_$r" 28672x4096:1,4,4,1,1,1,1,4
      done
      decode_profiles next_decode 64,4,3 64,8,3
      TAIL=10 step 300 next_moe_even python3 benchmarks/moe_gpu.py --skip kit,kernel,chain \
        --batches 1 --runners triton,triton+noeven,triton,triton+noeven --overlap ;;
    decode_sweep)  # the decode kernel's launch (BLOCK_N, warps, stages) at batch 1 in the MoE
      # model's step: the attention kernels' figures of its profile for each (DECODE_LAUNCHES)
      decode_profiles decode ${DECODE_LAUNCHES:-64,4,3 32,4,3 32,2,1 16,2,1 128,4,3} ;;
    moe_overlap)  # the MoE model at batch 1 as the server runs it (the next step built while
      # the GPU runs this one, the overlap scheduler's way) and with the host waiting, twice
      TAIL=6 step 300 moe_overlap python3 benchmarks/moe_gpu.py --skip kit,kernel,chain \
        --batches 1 --runners triton,triton --overlap ;;
    w4_sync)  # one row of 4-bit codes: the swapped affine kernel's launches of 16-32 outputs a
      # program (mma.sync, no warp-group waits) against 128 (warp-group products, the
      # shipped launches' width); alone in a call (a few hundred launches to build)
      TAIL=40 step 450 w4_sync python3 benchmarks/swap_affine_gpu.py --search --rows 1 \
        --block-n 16:1,32:1,32:2,128:4 ;;
    final_quant)  # the session's end state: GPU checks of every format's routing, the sampling
      # kernel's (a biased row included), the step, the fp8 model at batch 1
      swap_tests
      TAIL=4 step 200 quant_checks python3 tests/runtime/quant_kernel_checks.py cuda
      TAIL=3 step 120 sample_tests python3 -m pytest -q -p no:cacheprovider -m gpu \
        tests/runtime/test_sample_kernel.py
      TAIL=9 step 100 final_step python3 benchmarks/quant_gpu.py --batches 1 --schemes \
        fp8_tensor,ct_fp8_dynamic,modelopt_fp8,fp8_block,ct_w8a8_int8
      TAIL=8 step 200 fp8_e2e python3 benchmarks/e2e_gpu.py --backends triton --batches 1 \
        --quantization fp8 --hf "" --steps 32 --rounds 2 ;;
    swap_tests) swap_tests ;;
    moe_hints)  # the experts' weights read with L2 cache hints (ENGINE_MOE_L2_HINTS: 1, weights
      # evict_first; 2, also the down projection's prefetch evict_last) against none: the layer
      # in a chain of 8 at 1 and 8 tokens, the three alternating twice (moe_hints_model: the
      # model; a call each)
      for r in 1 2; do
        for v in 0 1 2; do
          ENGINE_MOE_L2_HINTS=$v TAIL=4 step 150 "moe_hints_chain_${v}_$r" python3 \
            benchmarks/moe_gpu.py --skip kit,kernel,model --chain-tokens 1,8
        done
      done ;;
    moe_hints_model)  # the model at batch 1 (synchronous and overlapped) with the hints at 0,
      # 1 and 2, alternating twice
      TAIL=14 step 540 moe_hints_model python3 benchmarks/moe_gpu.py --skip kit,kernel,chain \
        --batches 1 --runners triton,triton+hints,triton+keep,triton,triton+hints,triton+keep \
        --overlap ;;
    moe_hints_default)  # the model at batch 1 with the one-token default (hints 1) against
      # none, alternating twice
      TAIL=10 step 400 moe_hints_default python3 benchmarks/moe_gpu.py --skip kit,kernel,chain \
        --batches 1 --runners triton,triton+nohints,triton,triton+nohints --overlap ;;
    int4pack)  # 4-bit weight-only products through torch._weight_int4pack_mm against ours and
      # bf16, per layer at 1-2048 rows, checked against float32 first; its GPU tests; the step
      # of gptq and awq with the layout (ENGINE_W4_INT4PACK=1) and without, twice
      TAIL=30 step 240 int4pack python3 benchmarks/int4pack_gpu.py
      int4pack_steps ;;
    int4pack_step) int4pack_steps ;;
    moe_wide)  # one-token launches of 2-8 outputs a program and whole-row K tiles in the chain
      # of 8 layers, then the model at batch 1 with the fastest against the default, twice
      TAIL=60 step 420 moe_wide python3 benchmarks/moe_gpu.py --skip kit,kernel \
        --chain-tokens 1 --wide-sweep --batches 1 --overlap \
        --runners triton,triton+best,triton,triton+best ;;
    moe_one_token)  # the one-token launch as shipped: the runner kit on CUDA, the sparse chain's
      # checks, where the MoE model's batch-1 step goes, the model at batch 1 with the residual
      # added in the combine against a norm kernel's add (ENGINE_SPARSE_RESIDUAL=0)
      TAIL=8 step 200 moe_kit python3 benchmarks/moe_gpu.py --skip kernel,chain,model \
        --runners triton
      TAIL=3 step 150 layer_checks python3 tests/runtime/fused_gemv_checks.py cuda
      TAIL=30 step 120 moe_profile python3 benchmarks/profile_decode_gpu.py --batch 1 \
        --steps 20 --model-dir tests/data/qwen3-30b-a3b-dummy --no-kernel-table
      TAIL=14 step 300 moe python3 benchmarks/moe_gpu.py --skip kit,kernel,chain --batches 1 \
        --runners triton,triton+noresidual,triton,triton+noresidual --overlap ;;
    moe_residual)  # the combine's residual (the default) against the norm kernel's add, 3 times
      R=triton,triton+noresidual
      TAIL=14 step 400 moe_residual python3 benchmarks/moe_gpu.py --skip kit,kernel,chain \
        --batches 1 --runners $R,$R,$R --overlap ;;
    moe_final)  # where the MoE model's batch-1 step goes, then moe_residual
      TAIL=30 step 120 moe_profile python3 benchmarks/profile_decode_gpu.py --batch 1 \
        --steps 20 --model-dir tests/data/qwen3-30b-a3b-dummy --no-kernel-table
      R=triton,triton+noresidual
      TAIL=14 step 400 moe_residual python3 benchmarks/moe_gpu.py --skip kit,kernel,chain \
        --batches 1 --runners $R,$R,$R --overlap ;;
    moe_narrow)  # around moe_wide's best: 1-4 outputs a program, whole rows, each projection's
      # own warps; then the model at batch 1 with the fastest against the default, twice
      TAIL=60 step 480 moe_narrow python3 benchmarks/moe_gpu.py --skip kit,kernel \
        --chain-tokens 1 --wide-sweep narrow --batches 1 --overlap \
        --runners triton,triton+best,triton,triton+best ;;
    block_rows)  # block fp8's launches from the step search against those before, 1-16 rows
      python3 - "$OUT/block_before.json" <<'PY'
import json, sys
old = {"tall": [128, 128, 8, 4, 4], "square": [128, 128, 8, 4, 4],
       "wide": [128, 128, 2, 4, 3], "deep": [64, 128, 8, 4, 3, 2]}
json.dump({f"fp8,block,{c},{b}": v for c, v in old.items() for b in (1, 4, 16)},
          open(sys.argv[1], "w"))
PY
      for r in 1 2; do
        TAIL=3 step 60 "block_before_$r" python3 benchmarks/quant_gpu.py --batches 1,4,16 \
          --schemes fp8_block --launches "$OUT/block_before.json"
        TAIL=3 step 60 "block_now_$r" python3 benchmarks/quant_gpu.py --batches 1,4,16 \
          --schemes fp8_block
      done ;;
    topk_profile)  # the router's top-k over packed keys: the fused kernels' GPU checks, where the
      # MoE model's batch-1 step goes (the top-k kernel's figure against the profiles before)
      TAIL=3 step 100 fused_checks python3 tests/runtime/fused_checks.py cuda
      TAIL=30 step 120 moe_profile python3 benchmarks/profile_decode_gpu.py --batch 1 \
        --steps 20 --model-dir tests/data/qwen3-30b-a3b-dummy --no-kernel-table ;;
    block_search)  # block fp8's one-row launches chosen by the step (16-32 outputs a program,
      # mma.sync, among them), then the step at 1 row with them and without, twice
      TAIL=80 step 400 block_search python3 benchmarks/quant_gpu.py --step-search fp8_block \
        --write-launches "$OUT/block.json"
      for r in 1 2; do
        TAIL=3 step 60 "block_shipped_$r" python3 benchmarks/quant_gpu.py --batches 1 \
          --schemes fp8_block
        TAIL=3 step 60 "block_searched_$r" python3 benchmarks/quant_gpu.py --batches 1 \
          --schemes fp8_block --launches "$OUT/block.json"
      done ;;
    step_search)  # the one-row launches chosen by the step's time (fp8), then the step with them
      W8=fp8_tensor,ct_fp8_dynamic,modelopt_fp8,fp8_block,ct_w8a8_int8
      TAIL=60 step 330 step_search python3 benchmarks/quant_gpu.py --step-search fp8_tensor \
        --write-launches "$OUT/step_search.json"
      TAIL=7 step 90 step_searched python3 benchmarks/quant_gpu.py --batches 1 \
        --schemes $W8 --launches "$OUT/step_search.json" ;;
    ncu)  # Nsight Compute's counters for the one-row products and the one-token MoE layer
      TAIL=1 step 300 ncu "$(ncu_bin)" --clock-control none \
        -k 'regex:_gemv|_w8_swap|_affine|_pair|_combine' --section SpeedOfLight \
        --section Occupancy --section LaunchStats --section WarpStateStats \
        --section MemoryWorkloadAnalysis python3 benchmarks/ncu_products_gpu.py \
        --formats bf16,fp8,int4,moe --repeat 1
      KEYS="launch |^  _|Duration|DRAM Throughput|SM Active Cycles|Elapsed Cycles|Grid Size"
      KEYS="$KEYS|Block Size|Registers Per|Dynamic Shared|Achieved Occupancy|Warp Cycles Per Iss"
      grep -E "$KEYS" "$OUT/ncu.log" ;;
    moe_onewarp)  # one-token launches of one-warp programs (no reduction across warps) in
      # either projection, in the chain of 8 layers, beside the shipped launch
      TAIL=14 step 140 moe_onewarp python3 benchmarks/moe_gpu.py --skip kit,kernel,model \
        --chain-tokens 1 --wide-sweep onewarp ;;
    producer_codes)  # block fp8's inputs written as group codes by the norm and SiLU-and-mul
      # kernels and the output projection's by the triton decode merge (the default; e2e
      # mode :nocodes without any, :noocodes without the merge's): the GPU checks, then the dummy block fp8 Llama-3-8B in
      # the three forms at batch 1 and 4 (rounds rotate them), and the dense model in the
      # same call for the ratio
      TAIL=3 step 200 producer_codes_tests python3 -m pytest -q -m gpu \
        tests/runtime/test_group_codes.py
      TAIL=30 step 360 producer_codes_e2e python3 benchmarks/e2e_gpu.py --backends \
        triton:nocodes,triton:noocodes,triton --model-dir tests/data/llama3-8b-fp8-block-dummy \
        --batches 1,4 --hf "" --steps 32 --rounds 4
      TAIL=12 step 200 producer_codes_bf16 python3 benchmarks/e2e_gpu.py --backends triton \
        --batches 1,4 --hf "" --steps 32 --rounds 2 ;;
    affine_mma)  # one row of 4-bit codes on the matrix unit from registers (Gluon,
      # engine.runtime.affine_mma; ENGINE_AFFINE_MMA=1): its GPU checks, its launches against
      # the shipped route per layer (x a tile ahead or at use, words through L2 or L1, 1-2
      # tiles of words in flight), then the step of gptq and awq with it off and on, twice
      TAIL=1 step 90 affine_mma_tests python3 -m pytest -q -p no:cacheprovider -m gpu \
        tests/runtime/test_affine_mma.py
      configs="1,4,4,2,2,0,1;1,4,4,2,2,1,1;1,4,4,2,1,1,1;2,4,2,4,1,1,1;2,4,2,4,1,1,0"
      configs="$configs;1,4,2,8,1,1,1;1,4,4,4,1,1,1;1,8,4,4,2,0,1;1,4,4,8,2,0,1"
      TAIL=9 step 240 affine_mma_layers python3 benchmarks/affine_mma_gpu.py --skip-checks \
        --configs "${AFFINE_MMA_CONFIGS:-$configs}"
      for r in 1 2; do
        for v in 0 1; do
          ENGINE_AFFINE_MMA=$v TAIL=3 w4_step "affine_mma_${v}_$r"
        done
      done ;;
    affine_stages)  # the Gluon one-row 4-bit kernel with its words through stages of shared
      # memory (asynchronous copies, S - 1 tiles in flight a warp): its launches checked
      # (groups of 128) and timed per layer, then the gptq/awq step with the shipped route and
      # with the kernel at 4 stages (ENGINE_AFFINE_MMA_STAGES=4)
      configs="1,4,4,1,1,1,1,4;1,4,4,2,1,1,1,4;1,4,4,2,1,1,1,8;1,4,4,1,1,1,1,8"
      configs="$configs;1,4,2,4,1,1,1,4;2,4,4,1,1,1,1,4"
      TAIL=12 step 300 affine_stages_layers python3 benchmarks/affine_mma_gpu.py \
        --light-checks --configs "${AFFINE_MMA_CONFIGS:-$configs}"
      for v in 0 1; do
        ENGINE_AFFINE_MMA=$v ENGINE_AFFINE_MMA_STAGES=4 TAIL=3 w4_step "affine_stages_$v"
      done
      TAIL=2 step 300 affine_stages_tests python3 -m pytest -q -p no:cacheprovider -m gpu \
        tests/runtime/test_affine_mma.py ;;
    affine_route)  # the fused gate/up weight's one row alone through the Gluon kernel at 4
      # stages of shared memory (ENGINE_AFFINE_MMA_ROUTE), every other product as shipped: the
      # kernel's GPU tests, the gptq/awq step A/B twice, then gate/up launches near that one
      TAIL=2 step 200 affine_route_tests python3 -m pytest -q -p no:cacheprovider -m gpu \
        tests/runtime/test_affine_mma.py
      for r in 1 2; do
        w4_route_step "affine_route_shipped_$r" ""
        w4_route_step "affine_route_route_$r" "${AFFINE_ROUTE:-28672x4096:1,4,4,1,1,1,1,4}"
      done
      configs="1,4,4,1,1,1,1,2;1,8,4,1,1,1,1,4;1,2,4,1,1,1,1,4;2,4,4,1,1,1,1,4"
      configs="$configs;1,4,2,1,1,1,1,4;1,8,2,1,1,1,1,4;1,4,4,1,1,1,1,4"
      TAIL=12 step 240 affine_route_layers python3 benchmarks/affine_mma_gpu.py \
        --skip-checks --configs "${AFFINE_MMA_CONFIGS:-$configs}" ;;
    affine_cols)  # one row of 4-bit codes with the groups in the product's columns (the
      # swapped kernel's XSUM 2, its one-row launches): its GPU checks, then the step of gptq
      # and awq with one row on the gemv (ENGINE_AFFINE_SWAP_FIRST=2) and on the swapped
      # kernel, alternating twice
      TAIL=3 step 200 affine_cols_tests python3 -m pytest -q -m gpu \
        tests/runtime/test_swap_affine.py
      for r in 1 2; do
        for v in gemv swap; do
          first=1
          if [ $v = gemv ]; then first=2; fi
          ENGINE_AFFINE_SWAP_FIRST=$first w4_step "affine_cols_${v}_$r"
        done
      done ;;
    targets)  # the step of the formats with an H200 target at one row, as shipped: block and
      # per-tensor fp8 (every quantization launch written by the kernels before), then gptq
      # and awq with one row on the gemv (before) and on the swapped kernel; twice
      for r in 1 2; do
        TAIL=4 step 90 "targets_fp8_$r" python3 benchmarks/quant_gpu.py --batches 1 \
          --schemes fp8_block,fp8_tensor --model-inputs
        for first in 2 1; do
          ENGINE_AFFINE_SWAP_FIRST=$first w4_step "targets_w4_${first}_$r"
        done
      done ;;
    affine_cols_search)  # the one-row launch search of the swapped 4-bit kernel (XSUM 0-2)
      TAIL=30 step 500 affine_cols_search python3 benchmarks/swap_affine_gpu.py --search \
        --rows 1 ;;
    group_bound)  # block fp8's one-row group quantization: the step as shipped, the step with
      # the inputs as the decoder hands them over (group codes from the norm and SiLU kernels
      # where the layer takes them, made outside the graph), and with no quantization at all (a
      # bound: the codes made once outside the graph); per-tensor fp8 the control;
      # alternating twice
      # (ocodes: the inputs with the output projection's codes from the decode merge too)
      for r in 1 2; do
        for v in "" "--model-inputs" "ocodes" "--cached-group-codes"; do
          o=0; a=$v
          if [ "$v" = ocodes ]; then o=1; a=--model-inputs; fi  # (o=0: not the merge's)
          ENGINE_TRITON_OUTPUT_CODES=$o TAIL=4 step 90 \
            "group_bound_$(echo "${v:-default}" | tr -d ' -')_$r" python3 \
            benchmarks/quant_gpu.py --batches 1,4 --schemes fp8_block,fp8_tensor $a
        done
      done ;;
    ncu_source)  # Nsight Compute's per-instruction counters (SASS, warp stall samples) for
      # the one-token MoE layer's projections and the one-row 4-bit product (NCU_FORMATS,
      # NCU_KERNELS: others): one report, then its source page as CSV, one file a kernel
      # ($OUT/ncu_source_*.csv)
      KERNELS=${NCU_KERNELS:-_pair_gemv_up _pair_gemv_down _gemv_affine}
      TAIL=4 step 300 ncu_source_run "$(ncu_bin)" --clock-control none \
        -k "regex:$(echo $KERNELS | tr ' ' '|')" \
        --section SpeedOfLight --section WarpStateStats --section SourceCounters \
        --section LaunchStats -f -o "$OUT/ncu_source" python3 benchmarks/ncu_products_gpu.py \
        --formats "${NCU_FORMATS:-moe,int4}" --repeat 1
      for k in $KERNELS; do
        TAIL=2 step 120 "ncu_source_$k" "$(ncu_bin)" --import "$OUT/ncu_source.ncu-rep" \
          -k "$k" --page source --print-source sass --csv
        mv "$OUT/ncu_source_$k.log" "$OUT/ncu_source_$k.csv"
      done
      TAIL=60 step 60 ncu_source_details "$(ncu_bin)" --import "$OUT/ncu_source.ncu-rep" \
        --page details ;;
    ncu_attn)  # Nsight Compute's sections for the MoE model's decode attention kernels at
      # batch 1 (q/k norm + RoPE, the split kernel, the merge), each alone (graph nodes of the
      # timed steps, after the warm-up's launches), against the ~5 us each adds in the chain
      TAIL=1 step 300 ncu_attn "$(ncu_bin)" --clock-control none \
        -k 'regex:_decode_split|_decode_merge|_qk_norm_rope' --launch-skip 1500 \
        --launch-count 6 --section SpeedOfLight --section LaunchStats \
        --section WarpStateStats --section SchedulerStats --section Occupancy \
        python3 benchmarks/profile_decode_gpu.py --batch 1 --steps 20 --plain \
        --model-dir tests/data/qwen3-30b-a3b-dummy
      grep -vE "^==PROF==|^ +-+ |^$" "$OUT/ncu_attn.log" | grep -vE "^ +(OPT|INF) " | head -150 ;;
    ncu_moe)  # Nsight Compute's full sections for the one-token MoE layer's kernels alone
      TAIL=1 step 200 ncu_moe "$(ncu_bin)" --clock-control none -k 'regex:_pair|_combine' \
        --section SpeedOfLight --section Occupancy --section LaunchStats \
        --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
        python3 benchmarks/ncu_products_gpu.py --formats moe --repeat 1
      grep -vE "^==PROF==|^ +-+ |^$" "$OUT/ncu_moe.log" | grep -vE "^ +(OPT|INF) " | head -200 ;;
    sparse_chain)  # the sparse layer's attention half chained (ENGINE_SPARSE_CHAIN=0: off), A/B
      TAIL=3 step 200 layer_checks python3 tests/runtime/fused_gemv_checks.py cuda
      for v in 0 1 0 1; do
        ENGINE_SPARSE_CHAIN=$v TAIL=6 step 150 "sparse_chain_$v" python3 benchmarks/moe_gpu.py \
          --skip kit,kernel,chain --batches 1 --runners triton
      done ;;
    chain_default)  # the chained layer as the default: its GPU checks, decode A/B at 1 and 32
      TAIL=3 step 150 layer_checks python3 tests/runtime/fused_gemv_checks.py cuda
      TAIL=3 step 150 pdl_tests python3 -m pytest -q -p no:cacheprovider -m gpu \
        tests/runtime/test_triton_pdl.py tests/runtime/test_fused_kernels.py
      TAIL=14 step 300 chain_e2e python3 benchmarks/e2e_gpu.py --backends \
        triton,triton:unchained --batches 1,32 --hf "" --steps 32 --overlap ;;
    layer)
      TAIL=3 step 150 layer_checks python3 tests/runtime/fused_gemv_checks.py cuda
      TAIL=8 step 120 layer_products python3 benchmarks/step_products_gpu.py --small \
        --variants early,chain,early,chain
      TAIL=8 step 240 layer_e2e python3 benchmarks/e2e_gpu.py --backends \
        triton:unchained,triton,triton:unchained+fmerge,triton:fmerge --batches 1 --hf "" \
        --steps 32 ;;
    quant) ENGINE_PACKED_WEIGHT_ONLY=1 TAIL=9 step 100 quant python3 benchmarks/quant_gpu.py \
      --batches 1 --schemes fp8_tensor,ct_fp8_dynamic,modelopt_fp8,fp8_block,ct_w8a8_int8,gptq ;;
  esac
done
