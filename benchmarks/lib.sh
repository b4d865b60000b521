# shellcheck shell=bash
# Printing shared by the benchmarks (sourced; defines functions only).
#
#   print_series 'by hand to first step (s):     ' 1 "${hand[*]}"
#       -> by hand to first step (s):     12.3 11.9 12.0   median 12.0
#   print_median_ratio 'ratio train.yml / by hand:     ' "${pb[*]}" "${hand[*]}" ' (goal < 1.2)'
#       -> ratio train.yml / by hand:     1.05 (goal < 1.2)
#
# LABEL is printed as given (its padding included); VALUES are numbers separated by spaces.

# print_series LABEL DIGITS VALUES: the values and their median, DIGITS decimals each
print_series() {
  python3 - "$@" <<'PY'
import statistics, sys
label, digits, values = sys.argv[1], int(sys.argv[2]), [float(x) for x in sys.argv[3].split()]
print(label + ' '.join('%.*f' % (digits, x) for x in values) + '   median %.*f' % (digits, statistics.median(values)))
PY
}

# print_median_ratio LABEL VALUES_A VALUES_B [NOTE]: median of A / median of B, 2 decimals, then NOTE
print_median_ratio() {
  python3 - "$@" <<'PY'
import statistics, sys
label, a, b = sys.argv[1], [float(x) for x in sys.argv[2].split()], [float(x) for x in sys.argv[3].split()]
note = sys.argv[4] if len(sys.argv) > 4 else ''
print(label + '%.2f' % (statistics.median(a) / statistics.median(b)) + note)
PY
}
