# Shared by the benches that alternate ours and llama.cpp's for several rounds (sourced, not run):
# keeping every round's figure, and the medians and ratios the tables print.

# llama_bench_tokens_per_s LLAMA_BENCH_ARGS... -> the avg_ts of each of llama-bench's tests, in its
# order, on one line (its CSV output; e.g. -p 128,512 -n 128 gives "pp128 pp512 tg128").
llama_bench_tokens_per_s() {
  "$bin/llama-bench" "$@" -r 1 -o csv 2>/dev/null |
    awk -F, 'NR > 1 {gsub(/"/, ""); for (i = 1; i <= NF; ++i) if (h[i] == "avg_ts") print $i} NR == 1 {gsub(/"/, ""); for (i = 1; i <= NF; ++i) h[i] = $i}' |
    paste -sd' '
}
# Every round's figure is kept: result[NAME] holds them in round order, one per round (the caller
# declares `declare -A result`).
record() { result[$1]="${result[$1]:+${result[$1]} }$2"; }
median() { tr ' ' '\n' <<<"$1" | sort -g | awk '{v[NR] = $1} END {print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}'; }
# ratio OURS THEIRS: "median (min-max)" of the rounds' ours / theirs
ratio() {
  paste -d' ' <(tr ' ' '\n' <<<"$1") <(tr ' ' '\n' <<<"$2") | awk '{print $1 / $2}' | sort -g |
    awk '{v[NR] = $1} END {printf "%.2fx (%.2f-%.2f)", (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2), v[1], v[NR]}'
}
