"""The compile report's HTML: one self-contained page (inline CSS and SVG, no scripts, no network)
rendered from report_data.Report. Long parts are collapsed (<details>); the summary comes first."""
import datetime
import html
import os
import sys
import sysconfig

STAGES = ("capture", "aot", "lowering", "scheduling", "codegen", "build")
_COLORS = {"capture": "#5b8def", "aot": "#9b6bd6", "lowering": "#e5883a", "scheduling": "#d6b43b",
           "codegen": "#4caf7d", "build": "#d9534f"}

CSS = """
body{font:14px/1.45 -apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1200px;color:#222}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:3px}
.muted{color:#777} code,pre{font:12px/1.4 Menlo,Consolas,monospace}
pre{background:#f6f8fa;border:1px solid #e3e6ea;padding:8px;overflow:auto;max-height:480px;white-space:pre}
table{border-collapse:collapse;width:100%;margin:6px 0} td,th{border:1px solid #e3e6ea;padding:4px 6px;
text-align:left;vertical-align:top} th{background:#f3f5f8}
.cards{display:flex;gap:10px;flex-wrap:wrap;margin:12px 0}
.card{border:1px solid #e3e6ea;border-radius:6px;padding:8px 14px;min-width:110px;background:#fafbfc}
.card b{display:block;font-size:22px}
.bar{display:flex;height:18px;border-radius:4px;overflow:hidden;margin:6px 0}
.bar span{display:block;height:100%} .legend span{display:inline-block;margin-right:14px}
.sw{display:inline-block;width:10px;height:10px;margin-right:4px;border-radius:2px}
details{border:1px solid #e3e6ea;border-radius:6px;margin:6px 0;padding:4px 8px;background:#fff}
details>summary{cursor:pointer;font-weight:600} details details{margin-left:10px}
.kind{display:inline-block;background:#fdecea;color:#a12622;border-radius:10px;padding:0 8px;font-size:12px}
.ok{color:#2e7d32} .svg{overflow:auto;max-height:900px;border:1px solid #e3e6ea}
.svg svg{max-width:100%;height:auto}
"""


# shown shorter: installed packages from their package folder, the user's files from the working directory
_PREFIXES = sorted({p + os.sep for p in (sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
                                          os.getcwd())}, key=len, reverse=True)


def e(text):
    text = str(text)
    for prefix in _PREFIXES:
        text = text.replace(prefix, "")
    return html.escape(text)


def render(report):
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>kiln compile report</title>"
             f"<style>{CSS}</style></head><body>"]
    parts += _summary(report)
    parts += _stages(report)
    parts += _breaks(report)
    parts += _recompiles(report)
    parts += _dynamic(report)
    parts += _graph_index(report)
    parts += _kernel_index(report)
    parts += _frames(report)
    parts.append("</body></html>")
    return "\n".join(parts)


def _summary(report):
    when = datetime.datetime.fromtimestamp(report.started).strftime("%Y-%m-%d %H:%M:%S")
    total = sum(report.stage_seconds().values())
    cards = [("frames compiled", len(report.frames)), ("graphs", len(report.graphs)),
             ("graph breaks", len(report.graph_breaks)), ("recompiles", len(report.recompiles)),
             ("kernels", len(report.kernels)), ("compile time", f"{total:.2f} s")]
    out = ["<h1>kiln compile report</h1>",
           f"<div class='muted'>process {os.getpid()} &middot; {e(' '.join(sys.argv)[:200])} &middot; since {when}</div>",
           "<div class='cards'>" + "".join(f"<div class='card'><b>{e(v)}</b>{e(k)}</div>" for k, v in cards) + "</div>"]
    return out


def _stages(report):
    seconds = report.stage_seconds()
    total = sum(seconds.values()) or 1.0
    names = [s for s in STAGES if s in seconds] + [s for s in seconds if s not in STAGES]
    bar = "".join(f"<span title='{e(s)}' style='width:{100 * seconds[s] / total:.2f}%;"
                  f"background:{_COLORS.get(s, '#999')}'></span>" for s in names)
    legend = "".join(f"<span><i class='sw' style='background:{_COLORS.get(s, '#999')}'></i>{e(s)} "
                     f"{seconds[s]:.3f} s</span>" for s in names)
    rows = "".join(f"<tr><td>{e(f.qualname)} <span class='muted'>#{f.entry_index}</span></td>" +
                   "".join(f"<td>{f.stage_seconds.get(s, 0.0):.3f}</td>" for s in STAGES) + "</tr>"
                   for f in report.frames)
    return ["<h2>Compile time by stage</h2>", f"<div class='bar'>{bar}</div><div class='legend'>{legend}</div>",
            "<details><summary>per frame (seconds)</summary><table><tr><th>frame</th>" +
            "".join(f"<th>{s}</th>" for s in STAGES) + f"</tr>{rows}</table></details>"]


def _breaks(report):
    breaks = report.graph_breaks
    out = [f"<h2>Graph breaks ({len(breaks)})</h2>"]
    if not breaks:
        return out + ["<p class='ok'>No graph breaks.</p>"]
    rows = "".join(f"<tr><td><span class='kind'>{e(b.kind)}</span></td><td><code>{e(b.where or '?')}</code><br>"
                   f"<code>{e(b.line_text)}</code></td><td>{e(b.message)}<br><span class='muted'>{e(b.explanation)}"
                   f"</span></td><td>{e(b.hint)}</td></tr>" for b in breaks)
    return out + ["<table><tr><th>kind</th><th>where</th><th>why</th><th>suggested fix</th></tr>" + rows + "</table>"]


def _recompiles(report):
    out = [f"<h2>Recompiles ({len(report.recompiles)})</h2>"]
    if not report.recompiles:
        return out + ["<p class='ok'>No recompiles.</p>"]
    for r in report.recompiles:
        rows = "".join(f"<tr><td>entry {f.entry}</td><td><code>{e(f.guard)}</code></td><td><code>{e(f.source or '')}"
                       f"</code></td><td>{e(f.old)}</td><td>{e(f.new)}</td></tr>" for f in r.failures)
        out.append(f"<p><b>{e(r.frame)}</b></p><table><tr><th>cache entry</th><th>failed guard</th><th>checks</th>"
                   f"<th>compiled for</th><th>this call</th></tr>{rows}</table>")
    return out


def _dynamic(report):
    frames = [f for f in report.frames if f.dynamic_dims or f.pinned_sizes]
    out = [f"<h2>Dynamic dims ({sum(len(f.dynamic_dims) for f in frames)})</h2>"]
    if not frames:
        return out + ["<p class='muted'>Every size is static (a size that changes makes it dynamic on recompile).</p>"]
    rows = "".join(f"<tr><td>{e(f.qualname)} <span class='muted'>#{f.entry_index}</span></td><td>"
                   + ", ".join(f"<code>{e(d)}</code>" for d in f.dynamic_dims) + "</td><td>"
                   + "<br>".join(f"{e(what)} at <code>{e(where)}</code>" for what, where in f.pinned_sizes)
                   + "</td></tr>" for f in frames)
    return out + ["<table><tr><th>frame (cache entry)</th><th>symbolic sizes</th><th>sizes the program pinned "
                  f"(and the line that did)</th></tr>{rows}</table>"]


def _graph_index(report):
    out = [f"<h2>Graphs ({len(report.graphs)})</h2>"]
    rows = []
    for f in report.frames:
        g = f.graph
        if g is None:
            continue
        kernels = sum(len(c.kernels) for c in g.compiled)
        externs = sum(len(c.externs) for c in g.compiled)
        rows.append(f"<tr><td>graph {g.index}</td><td>{e(f.qualname)} <span class='muted'>#{f.entry_index}</span>"
                    f"</td><td>{g.op_count}</td><td>{kernels}</td><td>{externs}</td></tr>")
    return out + ["<table><tr><th>graph</th><th>frame (cache entry)</th><th>ops</th><th>kernels</th>"
                  "<th>aten calls</th></tr>" + "".join(rows) + "</table>"]


def _kernel_index(report):
    out = [f"<h2>Kernels ({len(report.kernels)})</h2>"]
    rows = []
    for g in report.graphs:
        for c in g.compiled:
            for k in c.kernels:
                rows.append(f"<tr><td><code>{e(k.name)}</code></td><td>graph {g.index}</td>"
                            f"<td>{e(', '.join(k.aten_ops))}</td><td>{'<br>'.join(e(x) for x in k.user_lines)}</td></tr>")
    if not rows:
        return out + ["<p class='muted'>No generated kernels (another backend, or everything ran through aten).</p>"]
    return out + ["<details><summary>all kernels: aten ops and user lines</summary><table><tr><th>kernel</th>"
                  "<th>graph</th><th>aten ops</th><th>user lines</th></tr>" + "".join(rows) + "</table></details>"]


def _frames(report):
    out = [f"<h2>Frames compiled ({len(report.frames)})</h2>"]
    for f in report.frames:
        out.append(_frame(f))
    return out


def _frame(f):
    title = f"{e(f.qualname)} <span class='muted'>{e(f.filename)}:{f.firstlineno} &middot; cache entry " \
            f"{f.entry_index} &middot; {f.seconds:.3f} s</span>"
    if f.graph is not None:
        title += f" &middot; {f.graph.op_count} ops"
    if f.graph_break is not None:
        title += f" &middot; <span class='kind'>{e(f.graph_break.kind)}</span>"
    body = []
    if f.eager_reason:
        body.append(f"<p><b>Runs eagerly:</b> {e(f.eager_reason)}</p>")
    if f.graph_break is not None:
        b = f.graph_break
        body.append(f"<p><b>Graph break</b> at <code>{e(b.where)}</code> <code>{e(b.line_text)}</code>: {e(b.message)}"
                    f"<br><span class='muted'>{e(b.hint)}</span></p>")
    if f.dynamic_dims:
        body.append("<p><b>Dynamic dims:</b> " + ", ".join(f"<code>{e(d)}</code>" for d in f.dynamic_dims) + "</p>")
    if f.guards:
        body.append(f"<details><summary>guards ({len(f.guards)})</summary><pre>{e(chr(10).join(f.guards))}</pre>"
                    "</details>")
    if f.graph is not None:
        body.append(_graph(f.graph))
    return f"<details><summary>{title}</summary>{''.join(body)}</details>"


def _graph(g):
    parts = [f"<details open><summary>graph {g.index}: {g.op_count} ops</summary>",
             f"<p class='muted'>{e(', '.join(g.ops))}</p>"]
    if g.svg:
        parts.append(f"<details><summary>picture</summary><div class='svg'>{g.svg}</div></details>")
    else:
        parts.append("<p class='muted'>(no picture: graphviz is not installed)</p>")
    parts.append(f"<details><summary>fx graph</summary><pre>{e(g.fx_code)}</pre></details>")
    for i, c in enumerate(g.compiled):
        label = "compiled" if len(g.compiled) == 1 else ("forward", "backward")[i] if i < 2 else f"part {i}"
        stages = ", ".join(f"{k} {v:.3f} s" for k, v in c.stage_seconds.items())
        parts.append(f"<details><summary>{label}: {len(c.kernels)} kernels, {len(c.externs)} aten calls"
                     f" <span class='muted'>({e(stages)})</span></summary>")
        if c.externs:
            parts.append(f"<p><b>through aten:</b> {e(', '.join(c.externs))}</p>")
        parts.append(f"<details><summary>aten graph</summary><pre>{e(c.aten_code)}</pre></details>")
        parts.append(f"<details><summary>loop IR</summary><pre>{e(c.ir_text)}</pre></details>")
        parts.append(f"<details><summary>schedule</summary><pre>{e(c.schedule_text)}</pre></details>")
        for k in c.kernels:
            parts.append(f"<details><summary>kernel <code>{e(k.name)}</code>: {e(', '.join(k.aten_ops))}</summary>"
                         f"<p>{'<br>'.join(e(x) for x in k.user_lines)}</p><pre>{e(k.code)}</pre></details>")
        parts.append(f"<details><summary>wrapper (Python)</summary><pre>{e(c.wrapper)}</pre></details>")
        parts.append("</details>")
    parts.append("</details>")
    return "".join(parts)
