// A job's page: charts from the API's curves, growing live from its SSE metrics stream;
// the page reloads itself when the job's status changes (its actions change with it).
"use strict";

const config = JSON.parse(document.getElementById("chart-config").textContent);
const STATUS_POLL_MS = 3000;
const BAND_FILL = "rgba(37, 99, 235, 0.15)";

// One chart's points: the steps and, per metric, its value at each step.
class LiveChart {
  constructor(def) {
    this.def = def;
    this.references = def.references || [];
    this.keys = [...def.series, ...(def.band ? [def.band] : []), ...this.references];
    this.steps = [];
    this.values = Object.fromEntries(this.keys.map((k) => [k, []]));
    const curves = def.band ? [def.series[0], "± std (upper)", "± std (lower)"] : def.series;
    const labels = [...curves, ...this.references];
    const bands = def.band ? [{ series: [2, 3], fill: BAND_FILL }] : [];
    this.figure = document.getElementById(`chart-${def.id}`);
    this.plot = makeChart(this.figure, labels, bands, {
      points: def.points, fraction: def.fraction, band: Boolean(def.band), steps: config.total_steps,
    });
  }

  add(step, metrics) {
    if (!this.keys.some((k) => metrics[k] !== undefined && metrics[k] !== null)) return;
    const last = this.steps.length ? this.steps[this.steps.length - 1] : -1;
    if (step <= last) return;
    this.steps.push(step);
    for (const k of this.keys) this.values[k].push(metrics[k] ?? null);
  }

  draw(weight) {
    let data;
    if (this.def.band) {
      const mean = smooth(this.values[this.def.series[0]], weight);
      const std = smooth(this.values[this.def.band], weight);
      const upper = mean.map((m, i) => (m === null || std[i] === null ? null : m + std[i]));
      const lower = mean.map((m, i) => (m === null || std[i] === null ? null : m - std[i]));
      data = [this.steps, mean, upper, lower];
    } else {
      data = [this.steps, ...this.def.series.map((k) => smooth(this.values[k], weight))];
    }
    // A baseline measured once is a level line at its value across every step.
    for (const k of this.references) {
      const known = this.values[k].filter((v) => v !== null && v !== undefined);
      const level = known.length ? known[known.length - 1] : null;
      data.push(this.steps.map(() => level));
    }
    this.plot.setData(data);
    showLatest(this.plot);
    this.figure.dataset.points = String(this.steps.length);
  }

  // What the chart draws, to tell two charts that draw the same apart.
  signature() {
    return JSON.stringify([this.steps, ...this.keys.map((k) => this.values[k])]);
  }
}

// Charts whose curves are the same (a logit-level objective's value is its loss) are
// drawn once: the first keeps both titles, the others are hidden.
function drawSameOnce() {
  const first = new Map();
  for (const chart of charts) {
    const seen = first.get(chart.signature());
    if (seen === undefined) { first.set(chart.signature(), chart); continue; }
    chart.figure.hidden = true;
    const caption = seen.figure.querySelector("figcaption");
    if (!caption.textContent.includes(chart.def.title)) caption.textContent += ` = ${chart.def.title}`;
  }
}

const charts = config.charts.map((def) => new LiveChart(def));
let redrawQueued = false;
const smoothing = smoothingControl(() => redraw());

function redraw() {
  if (redrawQueued) return;
  redrawQueued = true;
  requestAnimationFrame(() => {
    redrawQueued = false;
    const weight = smoothing();
    charts.forEach((chart) => chart.draw(weight));
  });
}

function addStep(step, metrics) {
  charts.forEach((chart) => chart.add(step, metrics));
}

// Curves arrive per metric; charts want rows per step.
function rowsFromCurves(curves) {
  const rows = new Map();
  for (const [key, curve] of Object.entries(curves)) {
    curve.steps.forEach((step, i) => {
      if (!rows.has(step)) rows.set(step, {});
      rows.get(step)[key] = curve.values[i];
    });
  }
  return [...rows.entries()].sort((a, b) => a[0] - b[0]);
}

function showProgress(stepsDone) {
  const stepsEl = document.getElementById("job-steps");
  const total = Number(stepsEl.dataset.total);
  stepsEl.textContent = `${stepsDone} / ${total}`;
  document.getElementById("job-progress").value = total ? Math.min(stepsDone / total, 1) : 0;
}

// What the job does now (a step, an eval prompt by prompt) and the time left, evals
// included, as its engine paces it (the API's `progress`, from the job's heartbeat).
function showDoing(progress) {
  const nowEl = document.getElementById("job-now");
  const etaEl = document.getElementById("job-eta");
  if (!progress || !nowEl) return;
  nowEl.textContent = progress.doing;
  if (etaEl && progress.eta_seconds !== null) etaEl.textContent = formatDuration(progress.eta_seconds);
}

function formatDuration(seconds) {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${String(s % 60).padStart(2, "0")}s`;
  return `${Math.floor(m / 60)}h ${String(m % 60).padStart(2, "0")}m`;
}

function follow(fromStep) {
  const stream = new EventSource(`/v1/jobs/${config.job_id}/metrics/stream?from_step=${fromStep}`);
  stream.addEventListener("step", (event) => {
    const data = JSON.parse(event.data);
    addStep(data.step, data.metrics);
    showProgress(data.step + 1);
    const kl = data.metrics["opd/reverse_kl_mean"];
    if (kl !== undefined && kl !== null) document.getElementById("job-kl").textContent = kl.toPrecision(4);
    if (!charts.length) location.reload();  // the first step: the page now has charts to draw
    redraw();
  });
  stream.addEventListener("end", () => stream.close());
}

async function start() {
  let next = config.next_step;
  const keys = charts.flatMap((chart) => chart.keys);
  if (keys.length) {
    const rows = rowsFromCurves(await fetchCurves(config.job_id, keys, config.max_points));
    rows.forEach(([step, metrics]) => addStep(step, metrics));
    if (rows.length) next = Math.max(next, rows[rows.length - 1][0] + 1);
    if (rows.length) drawSameOnce();
    redraw();
  }
  if (!config.finished) follow(next);
}

async function watchStatus() {
  const response = await fetch(`/v1/jobs/${config.job_id}`, { credentials: "same-origin" });
  if (!response.ok) return;
  const job = await response.json();
  if (job.status !== config.status) location.reload();
  showDoing(job.progress);
}

start();
if (!config.finished) setInterval(() => { watchStatus().catch(() => {}); }, STATUS_POLL_MS);
