"""The table and the plot of bench/split/frontier.sh from its run directories:
   frontier_table.py OUT ROUNDS "CUTS" DEFENSE...
prints the Markdown table and writes OUT/frontier.svg: each cell's test accuracy against
the learned inverter's SSIM (the stronger reconstruction at most cuts), one colour per
cut, with the SSIM of guessing the mean image as a floor line."""
import json
import os
import re
import sys


def total(path, pattern):
    """The number `pattern` captures on the first total line of a `cleave attack` output that has it."""
    for line in open(path):
        m = re.search(pattern, line)
        if line.startswith("total:") and m:
            return float(m.group(1))
    return None


def main(out, rounds, cuts, defenses):
    rows = []
    for cut in cuts:
        for name in defenses:
            d = f"{out}/cut{cut}-{name}"
            if os.path.exists(f"{d}.failed"):
                rows.append({"cut": cut, "defense": name, "failed": open(f"{d}.failed").read().strip()})
                continue
            if not os.path.exists(f"{d}.labels"):
                continue
            rows.append({
                "cut": cut, "defense": name,
                "acc": 100 * [json.loads(l) for l in open(f"{d}/metrics.jsonl")][-1]["test_accuracy"],
                "learned": total(f"{d}.images", r"learned SSIM ([0-9.]+)"),
                "optimised": total(f"{d}.images", r"optimised SSIM ([0-9.]+)"),
                "psnr": total(f"{d}.images", r"learned SSIM [0-9.]+ PSNR ([0-9.]+)"),
                "mean": total(f"{d}.images", r"mean image \(knowing nothing\) SSIM ([0-9.]+)"),
                "crossed": total(f"{d}.labels", r"crossed: ([0-9.]+) % true"),
                "dacc": total(f"{d}.labels", r"accuracy ([0-9.]+) %"),
                "dauc": total(f"{d}.labels", r"direction AUC ([0-9.]+)"),
            })

    print(f"LeNet-5 on Fashion-MNIST, 4 IID devices, {rounds} rounds of 100 steps; attacks on round {rounds}'s records.\n")
    print("| cut | defense | test accuracy % | learned SSIM | optimised SSIM | learned PSNR dB "
          "| labels that crossed, true % | labels from the gradients' direction, accuracy % (AUC) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if "failed" in r:
            print(f"| {r['cut']} | {r['defense']} | failed: {r['failed']} | | | | | |")
            continue
        crossed = "—" if r["crossed"] is None else f"{r['crossed']:.1f}"
        print(f"| {r['cut']} | {r['defense']} | {r['acc']:.2f} | {r['learned']:.3f} | {r['optimised']:.3f} "
              f"| {r['psnr']:.1f} | {crossed} | {r['dacc']:.1f} ({r['dauc']:.3f}) |")
    rows = [r for r in rows if "failed" not in r]
    means = [r["mean"] for r in rows if r["mean"] is not None]
    if means:
        print(f"\nGuessing the auxiliary images' mean scores SSIM {sum(means) / len(means):.3f}.")

    # The plot: accuracy (y) against the best reconstruction SSIM (x), by cut.
    W, H, L, B = 640, 420, 60, 50
    colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]
    accs = [r["acc"] for r in rows]
    lo, hi = (min(accs) - 2, max(accs) + 2) if accs else (0, 100)
    x = lambda s: L + s * (W - L - 20)
    y = lambda a: H - B - (a - lo) / max(hi - lo, 1e-9) * (H - B - 20)
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<line x1="{L}" y1="{H - B}" x2="{W - 20}" y2="{H - B}" stroke="black"/>',
           f'<line x1="{L}" y1="{H - B}" x2="{L}" y2="20" stroke="black"/>',
           f'<text x="{(W + L) / 2}" y="{H - 12}" text-anchor="middle">reconstruction SSIM (the stronger attack; lower is more private)</text>',
           f'<text x="14" y="{H / 2}" transform="rotate(-90 14 {H / 2})" text-anchor="middle">test accuracy %</text>']
    for t in [0, 0.2, 0.4, 0.6, 0.8, 1.0]:
        svg.append(f'<text x="{x(t)}" y="{H - B + 14}" text-anchor="middle">{t:.1f}</text>')
    for a in range(int(lo) + 1, int(hi) + 1, max(1, int((hi - lo) / 6))):
        svg.append(f'<text x="{L - 6}" y="{y(a) + 4}" text-anchor="end">{a}</text>')
    if means:
        m = sum(means) / len(means)
        svg.append(f'<line x1="{x(m)}" y1="20" x2="{x(m)}" y2="{H - B}" stroke="#999" stroke-dasharray="4 3"/>')
        svg.append(f'<text x="{x(m) + 4}" y="30" fill="#666">the mean image</text>')
    for i, cut in enumerate(cuts):
        c = colours[i % len(colours)]
        svg.append(f'<circle cx="{W - 120}" cy="{30 + 16 * i}" r="4" fill="{c}"/>'
                   f'<text x="{W - 110}" y="{34 + 16 * i}">cut {cut}</text>')
        for r in rows:
            if r["cut"] != cut:
                continue
            s = max(r["learned"], r["optimised"])
            svg.append(f'<circle cx="{x(s):.1f}" cy="{y(r["acc"]):.1f}" r="4" fill="{c}"><title>cut {cut}, '
                       f'{r["defense"]}: SSIM {s:.3f}, accuracy {r["acc"]:.2f} %</title></circle>')
            svg.append(f'<text x="{x(s) + 5:.1f}" y="{y(r["acc"]) - 4:.1f}" fill="{c}" font-size="9">{r["defense"]}</text>')
    svg.append("</svg>")
    open(f"{out}/frontier.svg", "w").write("\n".join(svg) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4:])
