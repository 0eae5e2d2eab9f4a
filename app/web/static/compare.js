// Compare: one metric of each chosen job on one chart.
"use strict";

const compare = JSON.parse(document.getElementById("compare-config").textContent);

async function drawComparison() {
  const curves = await fetchJobsCurves(compare.jobs.map((job) => job.id), compare.metric, compare.max_points);
  const labels = compare.jobs.map((job) => `#${job.id} ${job.name}`);
  const figure = document.getElementById("chart-compare");
  const plot = makeChart(figure, labels, []);
  const tables = curves.map((c) => {
    const curve = c[compare.metric] || { steps: [], values: [] };
    return [curve.steps, curve.values];
  });
  const aligned = uPlot.join(tables);
  const draw = () => {
    const weight = smoothing();
    plot.setData([aligned[0], ...aligned.slice(1).map((ys) => smooth(ys, weight))]);
    showLatest(plot);
    figure.dataset.points = String(aligned[0].length);
  };
  const smoothing = smoothingControl(draw);
  draw();
}

drawComparison();
