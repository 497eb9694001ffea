"""Summarise a stack-sampler file: per thread, the share of samples at each innermost frame
(where the thread was) and the heaviest inclusive frames.

    python3 benchmarks/stack_sampler/summary.py stacks-PID.txt [--top 15]"""

import sys
from collections import Counter, defaultdict


def main() -> None:
    path = sys.argv[1]
    top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 15
    lines = open(path).read().splitlines()
    print(lines[0])
    inner: dict[str, Counter] = defaultdict(Counter)
    incl: dict[str, Counter] = defaultdict(Counter)
    totals: Counter = Counter()
    for line in lines[1:]:
        stack, n = line.rsplit(" ", 1)
        n = int(n)
        thread, *frames = stack.split(";")
        totals[thread] += n
        if frames:
            inner[thread][frames[-1]] += n
        for f in set(frames):
            incl[thread][f.split(" (")[0] + " (" + f.split(" (")[1].split(":")[0] + ")"] += n
    for thread, total in totals.most_common():
        print(f"\n== {thread}: {total} samples")
        print("  innermost:")
        for f, n in inner[thread].most_common(top):
            print(f"    {100 * n / total:5.1f}%  {f}")
        print("  inclusive:")
        for f, n in incl[thread].most_common(top):
            print(f"    {100 * n / total:5.1f}%  {f}")


if __name__ == "__main__":
    main()
