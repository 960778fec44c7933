#!/bin/sh
# Writes the training corpus of models/muse-spark-demo: the King James Bible from Debian's bible-kjv
# package (apt-get install bible-kjv), one verse a line with the verse numbers removed, a heading line
# per chapter, chapters separated by a blank line.
set -e
out=${1:-kjv.txt}
bible -l100000 "Gen1:1-Rev22:21" | python3 -c '
import re, sys
out = []
for line in sys.stdin:
    line = line.rstrip("\n")
    m = re.match(r"^\s+\d+ (.*)$", line)
    if m:
        out.append(m.group(1).strip())
    elif line.strip():
        out.append("")
        out.append(line.strip())
sys.stdout.write("\n".join(out).strip() + "\n")
' > "$out"
wc -c "$out"
