// Every dashboard page: confirmations, copy buttons, live rows of the jobs table.
"use strict";

document.addEventListener("submit", (event) => {
  const form = event.target;
  const question = form.dataset.confirm;
  if (question && !window.confirm(question)) {
    event.preventDefault();
    return;
  }
  if (form.id === "new-job-form") {
    // One submission per click burst; the idempotency key makes a repeat harmless anyway.
    form.querySelector("button[type=submit]").disabled = true;
  }
});

function copyText(text) {
  if (navigator.clipboard && window.isSecureContext) {
    return navigator.clipboard.writeText(text);
  }
  const area = document.createElement("textarea");
  area.value = text;
  area.setAttribute("readonly", "");
  area.className = "offscreen";
  document.body.appendChild(area);
  area.select();
  document.execCommand("copy");
  area.remove();
  return Promise.resolve();
}

document.addEventListener("click", (event) => {
  const button = event.target.closest("button[data-copy]");
  if (!button) return;
  copyText(button.dataset.copy).then(() => {
    const label = button.textContent;
    button.textContent = "Copied";
    setTimeout(() => { button.textContent = label; }, 1500);
  });
});

const REFRESH_MS = 3000;

async function refreshLiveRows(table) {
  const live = [...table.querySelectorAll("tr[data-live]")];
  if (!live.length) return;
  const ids = live.map((row) => row.dataset.jobId).join(",");
  const response = await fetch(`${table.dataset.refresh}?ids=${ids}`, { credentials: "same-origin" });
  if (!response.ok) return;
  const holder = document.createElement("tbody");
  holder.innerHTML = await response.text();  // server-rendered, escaped rows of our own
  for (const fresh of [...holder.querySelectorAll("tr[data-job-id]")]) {
    const old = table.querySelector(`tr[data-job-id="${fresh.dataset.jobId}"]`);
    if (!old) continue;
    const picked = old.querySelector("input[type=checkbox]");
    if (picked) fresh.querySelector("input[type=checkbox]").checked = picked.checked;
    old.replaceWith(fresh);
  }
}

const jobsTable = document.getElementById("jobs-table");
if (jobsTable) {
  setInterval(() => { refreshLiveRows(jobsTable).catch(() => {}); }, REFRESH_MS);
}

// Uploading a dataset (Files page, New job page): the file itself is the request's body,
// sent with the page's CSRF token, so it streams as it does to POST /v1/files.
function uploadFile(form) {
  const file = form.elements.file.files[0];
  if (!file) return;
  const params = new URLSearchParams({ filename: file.name });
  for (const name of ["field", "answer_field"]) {
    const value = form.elements[name].value.trim();
    if (value) params.set(name, value);
  }
  const bar = form.querySelector("progress");
  const result = form.querySelector(".upload-result");
  const request = new XMLHttpRequest();
  request.open("POST", `/ui/files/upload?${params}`);
  request.setRequestHeader("X-CSRF-Token", form.dataset.csrf);
  request.upload.addEventListener("progress", (event) => {
    if (event.lengthComputable) bar.value = (100 * event.loaded) / event.total;
  });
  request.addEventListener("load", () => {
    bar.hidden = true;
    let answer = {};
    try { answer = JSON.parse(request.responseText); } catch (error) { answer = {}; }
    if (request.status < 300 && answer.url) {
      result.className = "upload-result";
      result.textContent = `Uploaded ${answer.id} (${answer.rows} rows). In a spec: dataset: {source: file, file: ${answer.id}}`;
      const link = document.createElement("a");
      link.href = answer.url;
      link.textContent = " Report";
      result.appendChild(link);
    } else {
      result.className = "upload-result form-error";
      result.textContent = `Not uploaded: ${answer.error || request.statusText}`;
    }
    form.querySelector("button[type=submit]").disabled = false;
  });
  bar.hidden = false;
  bar.value = 0;
  form.querySelector("button[type=submit]").disabled = true;
  request.send(file);
}

document.addEventListener("submit", (event) => {
  if (event.target.id !== "upload-file") return;
  event.preventDefault();
  uploadFile(event.target);
});
