# Issue 50: PPO on Craftax-Classic-Symbolic, this project's (`--config craftax-classic`, the
# Craftax paper's PPO configuration) and the paper's own (craftax_anchor.py: Craftax_Baselines'
# ppo.py, its defaults), on one GPU in one call. Needs the wheels of .whl-craftax (the base set
# of ../shared/gpu/fetch-wheels.sh plus craftax 1.6.1, distrax 0.1.9, tfp-nightly, decorator,
# gast) and a copy of Craftax_Baselines in .anchors/craftax_baselines; carry both:
#   run(carry=[".whl-craftax", ".anchors"]) WHL=.whl-craftax bash experiments/gpu/craftax.sh
#   ANCHOR_STEPS=1e9 ANCHOR_T=170 T=255 RESUME=1 ...   # the anchor until its time limit (its run cannot resume), then ours
#   ANCHOR=0 RESUME=1 T=540 ...                # ours alone, 1B steps over several calls (--resume auto; the
#                                              # next call within the machine's 30 s idle release, or /tmp/runs is gone)
#   CARRY_RUNS=.runs ANCHOR=0 RESUME=1 T=540 ...   # the same across machines and sessions (ours.sh): carry
#       [".whl-craftax", ".runs"] and copy $OUT/ours-craftax-0.tgz.* into .runs/ after each call (~35 MB)
# Prints one JSON line per run (anchor.jsonl, ours.jsonl under $OUT) and a table.
source experiments/gpu/setup.sh
PRESET=${PRESET:-craftax-classic}; SEED=${SEED:-0}; T=${T:-290}; ANCHOR=${ANCHOR:-1}; OURS=${OURS:-1}
EVAL_EVERY=${EVAL_EVERY:-1500}  # 10 evaluations in 15,258 updates (each plays up to 10,000 steps); a multiple of log_every 50
source experiments/gpu/ours.sh  # ours NAME FLAGS..., table
if [ "$ANCHOR" = 1 ]; then
  timeout ${ANCHOR_T:-$T} python3 experiments/gpu/craftax_anchor.py --baselines .anchors/craftax_baselines \
      --timesteps ${ANCHOR_STEPS:-1e9} --seed $SEED ${ANCHOR_NO_LOG:+--no-log} \
      >> $OUT/anchor.jsonl 2>> $OUT/anchor.err || echo "anchor: exit $?" >> $OUT/anchor.err
fi
if [ "$OURS" = 1 ]; then
  ours ours-craftax-$SEED --seed $SEED
fi
table  # ours.sh
