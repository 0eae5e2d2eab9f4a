// Chart helpers shared by the job and compare pages (uPlot, vendored).
"use strict";

const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#be185d", "#4d7c0f"];

// Exponential moving average, debiased like TensorBoard's; nulls stay gaps.
function smooth(values, weight) {
  if (!weight) return values.slice();
  let last = 0, count = 0;
  return values.map((v) => {
    if (v === null || v === undefined || !Number.isFinite(v)) return null;
    last = last * weight + (1 - weight) * v;
    count += 1;
    return last / (1 - Math.pow(weight, count));
  });
}

function chartWidth(figure) {
  return Math.max(280, Math.floor(figure.getBoundingClientRect().width) - 8);
}

// A uPlot chart in `figure` whose series are `labels` (one colour each): lines with gaps
// bridged, or, for `style.points` (evals measured at a few steps), points alone; a
// `style.fraction` on a 0..1 axis. The legend shows the latest values until the cursor
// points at a step (`showLatest`).
function makeChart(figure, labels, bands, style) {
  const shape = style || {};
  const series = [{ label: "step" }];
  labels.forEach((label, i) => {
    const hidden = label.startsWith("±");
    const colour = hidden ? "transparent" : PALETTE[i % PALETTE.length];
    series.push({
      label: label,
      stroke: colour,
      width: hidden ? 0 : 1.5,
      spanGaps: !shape.points,
      points: shape.points && !hidden ? { show: true, size: 7, fill: colour } : { show: false },
      paths: shape.points && !hidden ? () => null : undefined,
      show: true,
    });
  });
  const options = {
    width: chartWidth(figure),
    height: 220,
    series: series,
    bands: bands || [],
    scales: { x: xScale(shape), y: yScale(shape) },
    axes: [{ label: "step" }, {}],
    legend: { live: true },
  };
  const data = [[], ...labels.map(() => [])];
  const plot = new uPlot(options, data, figure);
  figure.dataset.style = shape.points ? "points" : "lines";
  window.addEventListener("resize", () => plot.setSize({ width: chartWidth(figure), height: 220 }));
  return plot;
}

// A job's charts span its steps from the start (a running 10-step job's eval points were
// drawn on 0..100, uPlot's range for one point); the eval after the last step included.
function xScale(shape) {
  return shape.steps ? { time: false, range: [0, shape.steps] } : { time: false };
}

// A fraction on 0..1; a mean with a ± std band on the mean's own range (the band, often
// wider than the mean moves, is clipped there), so the mean's course reads.
function yScale(shape) {
  if (shape.fraction) return { range: [0, 1] };
  if (!shape.band) return {};
  return {
    range: (u, min, max) => {
      const mean = (u.data[1] || []).filter((v) => v !== null && v !== undefined);
      if (!mean.length) return [min, max];
      const low = Math.min(...mean);
      const high = Math.max(...mean);
      const pad = (high - low) * 0.1 || Math.abs(high) * 0.1 || 1;
      return [low - pad, high + pad];
    },
  };
}

// The legend at the last step, where people read a chart's latest figures.
function showLatest(plot) {
  const steps = plot.data[0];
  if (steps.length && plot.cursor.idx == null) plot.setLegend({ idx: steps.length - 1 });
}

function smoothingControl(onChange) {
  const input = document.getElementById("smoothing");
  const shown = document.getElementById("smoothing-value");
  if (!input) return () => 0;
  input.addEventListener("input", () => { shown.textContent = input.value; onChange(); });
  return () => Number(input.value);
}

async function fetchCurves(jobId, keys, maxPoints) {
  const query = new URLSearchParams({ keys: keys.join(","), max_points: String(maxPoints) });
  const response = await fetch(`/v1/jobs/${jobId}/metrics?${query}`, { credentials: "same-origin" });
  if (!response.ok) throw new Error(`metrics of job ${jobId}: HTTP ${response.status}`);
  return (await response.json()).curves;
}

// Every job's curve in one call to GET /v1/metrics?jobs=...
async function fetchJobsCurves(ids, key, maxPoints) {
  const query = new URLSearchParams({ jobs: ids.join(","), keys: key, max_points: String(maxPoints) });
  const response = await fetch(`/v1/metrics?${query}`, { credentials: "same-origin" });
  if (!response.ok) throw new Error(`metrics of jobs ${ids}: HTTP ${response.status}`);
  return (await response.json()).jobs.map((job) => job.curves);
}
