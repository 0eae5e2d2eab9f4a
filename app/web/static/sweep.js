// A sweep's page: the trials table sorts by any column; one scatter per parameter of its
// value against the metric; the best trials' curves overlaid.
"use strict";

const sweep = JSON.parse(document.getElementById("sweep-config").textContent);

function cellValue(row, column) {
  const text = row.cells[column].dataset.value;
  const number = Number(text);
  return text !== "" && Number.isFinite(number) ? number : text;
}

// Click a header: sort by it (again: the other way); empty cells stay last.
function sortable(table) {
  const headers = [...table.tHead.rows[0].cells];
  headers.forEach((header, column) => {
    header.addEventListener("click", () => {
      const ascending = header.getAttribute("aria-sort") !== "ascending";
      headers.forEach((h) => h.removeAttribute("aria-sort"));
      header.setAttribute("aria-sort", ascending ? "ascending" : "descending");
      const body = table.tBodies[0];
      const rows = [...body.rows].sort((a, b) => {
        const x = cellValue(a, column), y = cellValue(b, column);
        if (x === "" || y === "") return (x === "") - (y === "");
        const order = typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y));
        return ascending ? order : -order;
      });
      rows.forEach((row) => body.appendChild(row));
    });
  });
}

// Value against metric, one point per trial with both; listed values sit at their index.
function scatter(figure) {
  const parameter = sweep.parameters[figure.dataset.path];
  const listed = parameter.values;
  const points = sweep.trials
    .filter((t) => t.metric !== null && t.values[figure.dataset.path] !== null)
    .map((t) => {
      const value = t.values[figure.dataset.path];
      return [listed ? listed.findIndex((v) => v === value) : value, t.metric];
    })
    .sort((a, b) => a[0] - b[0]);
  figure.dataset.points = String(points.length);
  const options = {
    width: chartWidth(figure),
    height: 220,
    scales: {
      x: listed ? { time: false, range: [-0.5, listed.length - 0.5] } : { time: false, distr: parameter.log ? 3 : 1 },
    },
    series: [
      { label: figure.dataset.path },
      { label: sweep.metric, stroke: PALETTE[0], paths: () => null, points: { show: true, size: 8, fill: PALETTE[0] } },
    ],
    axes: [
      listed ? { splits: () => listed.map((_, i) => i), values: (_, ticks) => ticks.map((i) => String(listed[i] ?? "")) } : {},
      {},
    ],
    legend: { live: true },
  };
  new uPlot(options, [points.map((p) => p[0]), points.map((p) => p[1])], figure);
}

async function bestCurves() {
  const figure = document.getElementById("chart-best");
  if (!figure || !sweep.best_jobs.length) return;
  const curves = await fetchJobsCurves(sweep.best_jobs, sweep.metric, sweep.max_points);
  const numbers = new Map(sweep.trials.map((t) => [t.job_id, t.number]));
  const labels = sweep.best_jobs.map((id) => `trial ${numbers.get(id)} (#${id})`);
  const plot = makeChart(figure, labels, []);
  const tables = curves.map((c) => {
    const curve = c[sweep.metric] || { steps: [], values: [] };
    return [curve.steps, curve.values];
  });
  const aligned = uPlot.join(tables);
  plot.setData(aligned);
  showLatest(plot);
  figure.dataset.series = String(labels.length);
}

const trialsTable = document.getElementById("trials-table");
if (trialsTable) sortable(trialsTable);
document.querySelectorAll("figure.scatter").forEach(scatter);
bestCurves();
