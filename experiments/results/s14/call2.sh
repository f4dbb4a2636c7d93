# Session 14, call 2: the heads backward kernel looping over row blocks with the parameter
# gradients in registers (ROW_GROUPS programs) against one program a block (row_groups past the
# block count: what main ran, with its [N / 64, D, K] fp32 partial sums), interleaved.
python3 experiments/gpu/variants.py \
  "one_block:fused_heads.heads=partial(row_groups=100000)" \
  "g528" \
  "g264:fused_heads.heads=partial(row_groups=264)" \
  "g1056:fused_heads.heads=partial(row_groups=1056)" \
  "g528s1:fused_heads.BACKWARD_STAGES=1" \
  "g264b128w8:fused_heads.heads=partial(row_groups=264, block_rows=128, num_warps=8)" \
  --rounds 2 2>&1 | grep -E "ceiling|round" | tee $OUT/heads_ab.txt
python3 -m jaxrl_mgpu.bench --transformer-step --d-model 128 --n-layers 4 --n-heads 4 --context-len 80 \
    --batch 4096 --precisions bf16 --attention pallas --mlp pallas --repeats 10 --profile /tmp/prof >/dev/null 2>&1
python3 experiments/gpu/trace_summary.py --all /tmp/prof > $OUT/trace_heads.txt; grep -E "heads|busy|fusion_31" $OUT/trace_heads.txt
