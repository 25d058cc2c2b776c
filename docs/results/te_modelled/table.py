"""python docs/results/te_modelled/table.py [OUT]: the TE figures of reports.sh's reports."""
import json, sys
OUT = sys.argv[1] if len(sys.argv) > 1 else "/tmp/te_demo"
rows = {}
for name in ("measured", "rerun", "equal", "agn19", "ae19", "wall"):
    try:
        r = json.load(open(f"{OUT}/rep_{name}/report.json"))
    except OSError:
        continue
    for f in r["protocol"]["figures"]:
        if f["kind"].startswith("temporal efficiency"):
            key = (f["where"], f["kind"])
            rows.setdefault(key, {})[name] = (f["mean"], f["lo"], f["hi"], f["n"], f["verdict"])
    for g in r["groups"]:
        if g["algo"] == "agn":
            rows.setdefault((g["label"], "group, all seeds"), {})[name] = (g["temporal_efficiency"]["mean"], g["temporal_efficiency"]["std"], g["temporal_efficiency"]["n"]) + ((g["temporal_efficiency_central"]["mean"],) if "temporal_efficiency_central" in g else ())
for k, v in sorted(rows.items()):
    print(k)
    for n, x in v.items():
        print("   ", n, " ".join(f"{y:.4f}" if isinstance(y, float) else str(y) for y in x))
