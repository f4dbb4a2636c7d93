# Issue 73: Atari on one GPU machine (16 CPU cores). Needs ale-py's cp312 wheel in .whl
# (bash ../shared/gpu/fetch-wheels.sh --brax ale-py==0.12.1; carry [".whl"]). From the repo root:
#   bash experiments/gpu/atari.sh                      # the ceiling, then PRESET's training throughput
#   GAME=breakout PRESET=atari-breakout-ppo T=540 ...  # a longer run (its return at T)
#   AUTO=1 ...                                        # ours at the size --auto-scale chooses
#   WHOLE=1 ...                                       # then ours again with each batch stepped whole
# 1. The ceiling: ale-py's vector environment alone, random actions, ENVS games on THREADS threads
#    (what any trainer on this host can reach), then the same stepped from a compiled loop on the
#    GPU through io_callback (ours) and through ale-py's xla() FFI: atari_interfaces.py, ceiling.jsonl.
# 2. Ours: `--config PRESET` for T seconds (ours.sh), one JSON line in ours.jsonl; the table prints
#    its steady env steps/s beside the ceiling.
# DRY=1 OUT=/tmp/x T=40 ENVS=8 THREADS=2 PRESET=atari-tiny GAME=breakout: a CPU check of the script.
source experiments/gpu/setup.sh
GAME=${GAME:-pong}; PRESET=${PRESET:-atari-pong-ppo}; T=${T:-240}; ENVS=${ENVS:-16}; THREADS=${THREADS:-16}
python3 experiments/gpu/atari_interfaces.py "$GAME" "$ENVS" "$THREADS" ${SECONDS_EACH:-15} > $OUT/ceiling.jsonl
cat $OUT/ceiling.jsonl
source experiments/gpu/ours.sh
# AUTO=1: the preset's --num-envs chosen by --auto-scale (its table and the host line in the log)
size=(--num-envs $ENVS); [ "${AUTO:-0}" = 1 ] && size=(--auto-scale)
EVAL_EVERY=${EVAL_EVERY:-0} ours atari-$GAME "${size[@]}" ${FLAGS:-}
# WHOLE=1: the same with the games stepped whole (pipeline=false): what the halves' overlap gains
[ "${WHOLE:-0}" = 1 ] && EVAL_EVERY=${EVAL_EVERY:-0} ours atari-$GAME-whole "${size[@]}" --env-args pipeline=false ${FLAGS:-}
table
