# Session 15, call 4 (with ../s14/split_settings.diff applied, not committed): the MLP rows and
# forward kernels on 32-row blocks (more programs an SM, if registers allow), and the rows
# kernel's hidden chunks 64 wide (half the shared memory a pipeline stage), interleaved.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee $OUT/card4.txt
python3 experiments/gpu/variants.py base \
  "rows32w4:fused_mlp.EXPERIMENT_ROWS=(32, 4)" \
  "rows32w2:fused_mlp.EXPERIMENT_ROWS=(32, 2)" \
  "fwd32w4:fused_mlp.EXPERIMENT_FORWARD=(32, 4)" \
  "rowsbh64:fused_mlp.finish_block=partial(rows_block_hidden=64)" \
  --rounds 2 2>&1 | grep -E "ceiling|round|rror" | tee $OUT/rows32_ab.txt
