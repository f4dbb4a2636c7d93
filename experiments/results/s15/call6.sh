# Session 15, call 6: call5.sh again (asked for as nvidia-h200 once more; an H100 came), its
# outputs saved here as call6_*.
bash experiments/results/s15/call5.sh
