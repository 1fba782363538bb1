"""prom_check.py: read `gpuctl metrics` output on stdin and check it is the
Prometheus text exposition format: every line a HELP, a TYPE or a sample;
each sample's metric has a TYPE before it; names and labels well formed;
values numbers. Prints the number of samples; exits 1 on the first bad line."""
import re
import sys

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*"'
SAMPLE = re.compile(r"^(%s)(\{(%s(,%s)*)?\})? (-?[0-9.eE+-]+|NaN|[+-]Inf)( -?[0-9]+)?$" % (NAME, LABEL, LABEL))
HELP = re.compile(r"^# HELP (%s) .*$" % NAME)
TYPE = re.compile(r"^# TYPE (%s) (counter|gauge|histogram|summary|untyped)$" % NAME)
typed, samples = {}, 0
for no, line in enumerate(sys.stdin.read().split("\n"), 1):
    if line == "":
        continue
    if line.startswith("# HELP"):
        if not HELP.match(line):
            sys.exit("line %d: bad HELP: %r" % (no, line))
    elif line.startswith("# TYPE"):
        m = TYPE.match(line)
        if not m:
            sys.exit("line %d: bad TYPE: %r" % (no, line))
        if m.group(1) in typed:
            sys.exit("line %d: second TYPE for %s" % (no, m.group(1)))
        typed[m.group(1)] = m.group(2)
    elif line.startswith("#"):
        continue
    else:
        m = SAMPLE.match(line)
        if not m:
            sys.exit("line %d: not a sample: %r" % (no, line))
        if m.group(1) not in typed:
            sys.exit("line %d: %s has no TYPE before it" % (no, m.group(1)))
        if not m.group(1).startswith("gpushare_"):
            sys.exit("line %d: %s lacks the gpushare_ prefix" % (no, m.group(1)))
        samples += 1
if samples == 0:
    sys.exit("no samples")
print("%d samples, %d metrics, all well formed" % (samples, len(typed)))
