# Session 14, call 7 (with split_settings.diff applied, not committed): the MLP forward and rows
# kernels each on their own rows / warps (session 13's r128x8 changed both at once), interleaved.
python3 experiments/gpu/variants.py base \
  "rows128w8:fused_mlp.EXPERIMENT_ROWS=(128, 8)" \
  "fwd128w8:fused_mlp.EXPERIMENT_FORWARD=(128, 8)" \
  "rows128w4:fused_mlp.EXPERIMENT_ROWS=(128, 4)" \
  --rounds 2 2>&1 | grep -E "ceiling|round" | tee $OUT/split_ab.txt
