// The job page's playground panel: the form is sent in the background and the worker's
// completions (an HTML fragment the server rendered and escaped) replace the last ones.
"use strict";

const tryForm = document.getElementById("try-form");
const tryResult = document.getElementById("try-result");

tryForm?.addEventListener("submit", async (event) => {
  event.preventDefault();
  const button = tryForm.querySelector("button[type=submit]");
  button.disabled = true;
  tryResult.textContent = "Sampling…";
  try {
    const response = await fetch(tryForm.action, {
      method: "POST",
      headers: { "Content-Type": "application/x-www-form-urlencoded" },
      body: new URLSearchParams(new FormData(tryForm)),
      credentials: "same-origin",
    });
    tryResult.innerHTML = await response.text();
  } catch (error) {
    tryResult.textContent = `The request failed: ${error}`;
  } finally {
    button.disabled = false;
  }
});
