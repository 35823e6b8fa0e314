// jobwire dashboard: live throughput chart over server-sent events. The page works
// without this script; it only redraws what the server rendered.
"use strict";
(function () {
  const chart = document.getElementById("chart");
  if (!chart || !window.EventSource) return;
  const history = 300;
  const width = chart.viewBox.baseVal.width;
  const height = chart.viewBox.baseVal.height;
  const names = ["submitted", "completed", "failed"];

  function draw(points) {
    let top = 1;
    for (const name of names) for (const v of points[name]) if (v > top) top = v;
    const step = width / (history - 1);
    for (const name of names) {
      const values = points[name].slice(-history);
      const offset = (history - values.length) * step;
      const coords = values.map((v, i) =>
        (offset + i * step).toFixed(1) + "," + (height - (v / top) * (height - 4) - 2).toFixed(1));
      document.getElementById("line-" + name).setAttribute("points", coords.join(" "));
    }
    document.getElementById("chart-top").textContent = top.toFixed(0);
  }

  const source = new EventSource("/ui/stream");
  source.onmessage = function (event) {
    const data = JSON.parse(event.data);
    draw(data.points);
    if (data.now) {
      for (const name of names) {
        document.getElementById("now-" + name).textContent = String(data.now[name]);
      }
    }
    chart.dataset.updates = String(Number(chart.dataset.updates || "0") + 1);
  };
  window.addEventListener("pagehide", function () { source.close(); });
})();
