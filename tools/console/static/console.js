// hotcount console: polls /console/api/state once a second (never more:
// the next poll is scheduled when the last one has answered) and draws it.
// Plain JS, no library, no build step.
"use strict";

const POLL_MS = 1000;
const WINDOW_MS = 5 * 60 * 1000;
const SVG = "http://www.w3.org/2000/svg";
const $ = (id) => document.getElementById(id);
const fmt = (n) => (n == null ? "–" : Math.round(n).toLocaleString("en-US"));
const fmtRate = (n) => (n == null ? "–" : n >= 100 ? fmt(n) : n.toFixed(1));

let topic = new URLSearchParams(location.search).get("topic") || "";
let timer = null;
let lastTopics = "";
let lastState = null;

// poll asks for the state, draws it, and schedules the next poll. A hidden
// tab does not poll.
async function poll() {
  clearTimeout(timer);
  if (!document.hidden) {
    try {
      const q = topic ? "?topic=" + encodeURIComponent(topic) : "";
      const resp = await fetch("/console/api/state" + q, { cache: "no-store" });
      const body = await resp.json();
      if (!resp.ok) throw new Error(body.error || resp.statusText);
      lastState = body;
      render(body);
      $("status").textContent = "live · updated " + new Date(body.now).toLocaleTimeString();
    } catch (e) {
      $("status").textContent = "not updating: " + e.message;
    }
  }
  timer = setTimeout(poll, POLL_MS);
}

function render(s) {
  renderTopics(s.topics || []);
  renderTopic(s.topic);
  renderFlow(s.series, s.now);
  renderTrending(s.trending);
  renderRace(s.race, s.raceEnabled);
}

// --- trending across the fleet ----------------------------------------------

function renderTrending(t) {
  $("trending").hidden = !t;
  if (!t) return;
  const body = $("trending-rows");
  body.replaceChildren();
  for (const [i, e] of (t.topics || []).entries()) {
    const tr = document.createElement("tr");
    for (const v of [i + 1, e.topic, fmt(e.count), fmt(e.contributors), e.score.toFixed(1)]) {
      const td = document.createElement("td");
      td.textContent = v;
      tr.append(td);
    }
    body.append(tr);
  }
  $("trending-note").textContent = t.note || ((t.topics || []).length ? "" : "nothing stands above its baseline");
}

// --- topic picker -------------------------------------------------------

function renderTopics(topics) {
  const filter = $("search").value.trim().toLowerCase();
  const shown = topics.filter((t) => t.topic.toLowerCase().includes(filter));
  if (topic && !topics.some((t) => t.topic === topic) && topic.toLowerCase().includes(filter)) {
    shown.unshift({ topic: topic, rate: null });
  }
  const key = JSON.stringify([shown.map((t) => [t.topic, Math.round(t.rate || 0)]), topic]);
  if (key === lastTopics) return;
  lastTopics = key;
  const ul = $("topics");
  ul.replaceChildren();
  for (const t of shown) {
    const li = document.createElement("li");
    li.dataset.topic = t.topic;
    if (t.topic === topic) li.className = "current";
    const name = document.createElement("span");
    name.className = "name";
    name.textContent = t.topic;
    name.title = t.topic;
    const rate = document.createElement("span");
    rate.className = "rate";
    rate.textContent = t.rate == null ? "" : fmtRate(t.rate) + "/s";
    li.append(name, rate);
    li.addEventListener("click", () => choose(t.topic));
    ul.append(li);
  }
  if (!shown.length) {
    const li = document.createElement("li");
    li.className = "muted";
    li.textContent = filter ? "no match: Enter opens “" + filter + "”" : "no topic written yet";
    ul.append(li);
  }
}

// choose opens a topic and puts it in the address, so that the link can be
// shared.
function choose(name) {
  topic = name;
  history.pushState(null, "", name ? "?topic=" + encodeURIComponent(name) : location.pathname);
  lastTopics = "";
  clearShards();
  poll();
}

$("search").addEventListener("input", () => {
  lastTopics = "";
  if (lastState) renderTopics(lastState.topics || []);
});
$("search").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && $("search").value.trim()) choose($("search").value.trim());
});
window.addEventListener("popstate", () => {
  topic = new URLSearchParams(location.search).get("topic") || "";
  clearShards();
  poll();
});
document.addEventListener("visibilitychange", () => {
  if (!document.hidden) poll();
});

// --- the chosen topic ---------------------------------------------------

let scale = 0; // the bars' full length; grows in steps, so bars fill up

function clearShards() {
  scale = 0;
  $("shards").replaceChildren();
}

function renderTopic(t) {
  $("topic-name").textContent = t ? t.name : "pick a topic";
  const err = $("topic-error");
  err.hidden = !(t && t.error);
  err.textContent = t && t.error ? t.error : "";
  const total = t && t.total;
  $("total").textContent = total ? fmt(total.gathered) : "–";
  $("total").dataset.value = total ? String(total.gathered) : "";
  $("total-meta").replaceChildren();
  if (total) {
    const badge = document.createElement("span");
    badge.className = "badge " + (total.stale ? "stale" : "fresh");
    badge.textContent = total.stale ? "stale" : "fresh";
    badge.id = "freshness";
    $("total-meta").append(badge, " gathered " + (total.ageMs / 1000).toFixed(1) + " s ago, from the " + total.source);
  }
  $("pending").textContent = total ? fmt(total.pending) : "–";
  $("with-pending").textContent = total ? fmt(total.withPending) + " with pending" : "";
  const sh = t && t.shards;
  if (sh) {
    $("shard-count").textContent = "writes on " + t.writeShards + ", reads " + sh.shards.length;
    $("raises").textContent = (t.raises || []).map(function (r) {
      return r.from + "→" + r.to + " at " + new Date(r.at).toLocaleTimeString() + (r.here ? " (this sidecar)" : " (another sidecar)");
    }).join(", ") || "no raise in the last hour";
    $("shards-meta").textContent = "sum " + fmt(sh.count) + " · read " + Math.max(0, ((Date.now() - sh.readAt) / 1000)).toFixed(1) + " s ago";
    renderBars(sh.shards, t.writeShards);
  } else {
    $("shard-count").textContent = "–";
    $("shards-meta").textContent = "";
  }
}

// renderBars draws one bar per shard of the read set. The bars share a
// scale, a round number at or above the largest shard (nice), so they fill
// up as increments land and the scale steps up when one is full.
function renderBars(shards, writeShards) {
  const max = Math.max(1, ...shards.map((s) => s.count));
  if (max > scale) scale = nice(max);
  const box = $("shards");
  if (box.children.length !== shards.length * 3) {
    box.replaceChildren();
    for (const s of shards) {
      const label = document.createElement("span");
      label.className = "shard-label";
      label.textContent = "shard " + s.shard;
      const track = document.createElement("div");
      track.className = "track";
      const fill = document.createElement("div");
      fill.className = "fill";
      track.append(fill);
      const count = document.createElement("span");
      count.className = "shard-count";
      box.append(label, track, count);
    }
  }
  shards.forEach((s, i) => {
    const track = box.children[i * 3 + 1];
    const count = box.children[i * 3 + 2];
    track.className = "track shard" + (s.shard >= writeShards ? " read-only" : "");
    track.dataset.shard = String(s.shard);
    track.title = s.shard >= writeShards ? "read, no longer written" : "written and read";
    track.firstChild.style.width = (100 * s.count / scale).toFixed(2) + "%";
    count.textContent = fmt(s.count);
    count.dataset.shard = String(s.shard);
  });
}

// nice is the next 1, 2, 2.5 or 5 × 10ⁿ at or above x: a scale to read.
function nice(x) {
  const p = Math.pow(10, Math.floor(Math.log10(x)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= x) return m * p;
  return 10 * p;
}

// --- charts ---------------------------------------------------------------

function renderFlow(series, now) {
  if (!series) return;
  const t = series.t;
  const xs = t.map((ms) => (ms - (now - WINDOW_MS)) / WINDOW_MS);
  chart("chart-flow", "legend-flow", xs, [
    { name: "mentions/s in", values: series.mentionsIn, color: "var(--blue)" },
    { name: "writes/s out", values: series.writesOut, color: "var(--green)" },
  ]);
  chart("chart-throttle", "legend-throttle", xs, [
    { name: "throttled/s", values: series.throttled, color: "var(--red)" },
    { name: "rerouted/s", values: series.rerouted, color: "var(--amber)" },
  ]);
  chart("chart-flush", "legend-flush", xs, [
    { name: "flush ms", values: series.flushMs, color: "var(--blue)" },
  ]);
  // The coalescing ratio over the last minute: mentions written per write.
  let flushed = 0, writes = 0;
  t.forEach((ms, i) => {
    if (ms >= now - 60000) {
      flushed += series.flushed[i] || 0;
      writes += series.writesOut[i] || 0;
    }
  });
  $("ratio").textContent = writes > 0 ? (flushed / writes).toFixed(1) + " mentions per write" : "–";
}

// chart draws lines (values in [0, max], null = no data) at xs in [0, 1]
// into an SVG of viewBox 600×150, and a legend with each line's last
// value and the scale.
function chart(svgId, legendId, xs, lines, opts = {}) {
  const W = 600, H = 150, PAD = 8;
  const svg = $(svgId);
  const max = nice(Math.max(1, opts.min || 0, ...lines.flatMap((l) => l.values.filter((v) => v != null))));
  svg.replaceChildren();
  for (const f of [0.25, 0.5, 0.75]) {
    const g = document.createElementNS(SVG, "line");
    g.setAttribute("class", "grid");
    g.setAttribute("x1", 0); g.setAttribute("x2", W);
    g.setAttribute("y1", H - PAD - f * (H - 2 * PAD)); g.setAttribute("y2", H - PAD - f * (H - 2 * PAD));
    svg.append(g);
  }
  for (const l of lines) {
    let pts = [];
    const flush = () => {
      if (pts.length > 1) {
        const p = document.createElementNS(SVG, "polyline");
        p.setAttribute("points", pts.join(" "));
        p.setAttribute("style", "stroke:" + l.color + (l.dash ? ";stroke-dasharray:6 4" : ""));
        svg.append(p);
      }
      pts = [];
    };
    l.values.forEach((v, i) => {
      if (v == null) return flush();
      pts.push((xs[i] * W).toFixed(1) + "," + (H - PAD - (v / max) * (H - 2 * PAD)).toFixed(1));
    });
    flush();
  }
  const legend = $(legendId);
  legend.replaceChildren();
  for (const l of lines) {
    const last = [...l.values].reverse().find((v) => v != null);
    const item = document.createElement("span");
    const swatch = document.createElement("i");
    swatch.style.background = l.color;
    item.append(swatch, l.name + ": " + (last == null ? "–" : fmtRate(last)));
    legend.append(item);
  }
  const sc = document.createElement("span");
  sc.className = "muted";
  sc.textContent = "scale 0–" + fmt(max);
  legend.append(sc);
}

// --- the race -------------------------------------------------------------

function renderRace(r, enabled) {
  const btn = $("race-start");
  btn.disabled = !enabled || (r && r.running);
  btn.title = enabled ? "" : "off here: --console-race turns it on (it is on in hotcount dev)";
  if (!enabled && !r) {
    $("race-status").textContent = "off in this sidecar (--console-race turns it on)";
    return;
  }
  if (!r) {
    $("race-status").textContent = "ready";
    return;
  }
  $("race-status").textContent = r.running
    ? "running: " + Math.ceil((r.durationMs - r.elapsedMs) / 1000) + " s left"
    : "done in " + (r.elapsedMs / 1000).toFixed(0) + " s";
  $("race-about").textContent = "One hot key on " + r.shards + " shard" + (r.shards > 1 ? "s" : "") +
    " with an emulated ceiling of " + fmt(r.ceiling) + " writes/s per key (DynamoDB's per-partition limit, scaled down). " +
    r.writers + " writers offer " + fmt(r.offered) + " mentions/s twice: each as its own write (direct), and through hotcount's aggregator and flusher every " +
    r.flushIntervalMs + " ms (coalesced). It runs on a throwaway store in memory: your counts are not touched.";
  const xs = r.points.map((p) => p.t / r.durationMs);
  const ceiling = r.points.map(() => r.ceiling * r.shards);
  chart("chart-race", "legend-race", xs, [
    { name: "ceiling", values: ceiling, color: "var(--grey)", dash: true },
    { name: "direct accepted/s", values: r.points.map((p) => p.direct), color: "var(--red)" },
    { name: "coalesced accepted/s", values: r.points.map((p) => p.coalesced), color: "var(--green)" },
  ], { min: r.offered });
  const secs = Math.max(r.elapsedMs / 1000, 0.001);
  for (const [name, c] of [["direct", r.direct], ["coalesced", r.coalesced]]) {
    $("race-" + name + "-mentions").textContent = fmt(c.mentions);
    $("race-" + name + "-writes").textContent = fmt(c.writes);
    $("race-" + name + "-throttled").textContent = fmt(c.throttled);
    $("race-" + name + "-rate").textContent = fmtRate(c.mentions / secs);
  }
}

$("race-start").addEventListener("click", async () => {
  $("race-start").disabled = true;
  try {
    // The header tells the sidecar the request comes from this page: a
    // form on another site cannot send it.
    const resp = await fetch("/console/api/race", { method: "POST", headers: { "X-Hotcount-Console": "1" } });
    if (!resp.ok) throw new Error((await resp.json()).error || resp.statusText);
    $("race-status").textContent = "starting…";
  } catch (e) {
    $("race-status").textContent = "could not start: " + e.message;
  }
  poll();
});

poll();
