// The console's one script: copy buttons. The pages work without it.
document.addEventListener("click", (e) => {
  const b = e.target.closest("button[data-copy]");
  if (!b) return;
  const el = document.getElementById(b.dataset.copy);
  if (!el) return;
  navigator.clipboard.writeText(el.value ?? el.textContent).then(() => { b.textContent = "Copied"; });
});
