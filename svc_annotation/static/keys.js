// The annotate page's keyboard: 0-5 score and submit (Shift: half a point more), u unsafe,
// o off-topic, n or Enter the next item (its URL in the script tag's data-next-url).
(function () {
  var form = document.getElementById("score-form"), busy = false;
  var next = document.getElementById("keys-script").dataset.nextUrl;
  window.addEventListener("pageshow", function () { busy = false; });
  document.addEventListener("keydown", function (e) {
    var t = e.target;
    if (busy || e.ctrlKey || e.metaKey || e.altKey) return;
    if (t && (t.tagName === "TEXTAREA" || (t.tagName === "INPUT" && t.type !== "checkbox"))) return;
    var digit = /^[0-5]$/.test(e.key) ? e.key : (/^(?:Digit|Numpad)([0-5])$/.exec(e.code) || [])[1];
    if (form && digit !== undefined) {
      var value = Number(digit) + (e.shiftKey && digit !== "5" ? 0.5 : 0);
      var button = form.querySelector('button[value="' + value + '"]');
      if (button) { e.preventDefault(); busy = true; button.click(); }
    } else if (form && (e.key === "u" || e.key === "o")) {
      var box = document.getElementById(e.key === "u" ? "unsafe" : "off_topic");
      e.preventDefault(); box.checked = !box.checked;
    } else if (e.key === "n" || (e.key === "Enter" && t.tagName !== "BUTTON")) {
      e.preventDefault(); busy = true; window.location.assign(next);
    }
  });
})();
