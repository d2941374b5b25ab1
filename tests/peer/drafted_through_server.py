#!/usr/bin/env python3
"""Drafted against serial through a running `tensorfold serve`: the same chat request with
`"draft": false` and with drafts, alternated, on the copy prompt of the paired benchmark and a chat
prompt, greedy and sampled; prints each median time, the speedup and whether every reply was the
same bytes. Usage: drafted_through_server.py URL [repetitions]"""
import json, sys, time, urllib.request, statistics

COPY = "Here is a Python module:\n\n```python\nimport math\n\n\ndef circle_area(radius):\n    return math.pi * radius ** 2\n\n\ndef circle_perimeter(radius):\n    return 2 * math.pi * radius\n\n\ndef square_area(side):\n    return side * side\n\n\ndef square_perimeter(side):\n    return 4 * side\n```\n\nRepeat the module exactly, with `radius` renamed to `r`."
CHAT = "Give me three tips for staying focused while studying."
url, reps = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3

def ask(prompt, draft, sampling):
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 256, "draft": draft, **sampling}
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    t = time.perf_counter()
    r = json.load(urllib.request.urlopen(req, timeout=120))
    return time.perf_counter() - t, r["choices"][0]["message"]["content"], r["usage"]

for pname, prompt in [("copy", COPY), ("chat", CHAT)]:
    for mode, sampling in [("greedy", {"temperature": 0}), ("sampled", {"temperature": 0.8, "top_p": 0.95, "seed": 7})]:
        ask(prompt, True, sampling); ask(prompt, False, sampling)  # warm both paths
        times = {True: [], False: []}; texts = {True: set(), False: set()}; usage = None
        for rep in range(reps):
            for draft in ([False, True] if rep % 2 == 0 else [True, False]):
                dt, text, u = ask(prompt, draft, sampling)
                times[draft].append(dt); texts[draft].add(text)
                if draft: usage = u
        same = len(texts[True] | texts[False]) == 1
        s, d = statistics.median(times[False]), statistics.median(times[True])
        det = usage["completion_tokens_details"]
        print(f"{pname:5} {mode:8} serial {s:6.3f}s drafted {d:6.3f}s speedup {s/d:5.2f}x  tokens {usage['completion_tokens']}  "
              f"drafts {det['draft_tokens']} accepted {det['accepted_draft_tokens']}  replies equal: {same}")
