// Hearth console: small enhancements over pages that work without script.
// - [data-copy=ID] buttons copy the value of the field ID (shown only here).
// - forms with data-confirm ask before they are sent.
// - the upload form shows its progress.
// - the playground streams its answer (the session, not a key, is sent).
"use strict";
document.addEventListener("DOMContentLoaded", function () {
  document.querySelectorAll("button[data-copy]").forEach(function (button) {
    var field = document.getElementById(button.dataset.copy);
    var status = button.parentElement.querySelector(".copied");
    if (!field) return;
    button.hidden = false;
    button.addEventListener("click", function () {
      field.select();
      var done = function () { if (status) status.textContent = "Copied."; };
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(field.value).then(done, function () {
          document.execCommand("copy"); done();
        });
      } else {
        document.execCommand("copy"); done();
      }
    });
  });
  document.querySelectorAll("form[data-confirm]").forEach(function (form) {
    form.addEventListener("submit", function (event) {
      if (!window.confirm(form.dataset.confirm)) event.preventDefault();
    });
  });
  var upload = document.getElementById("upload");
  var bar = document.getElementById("upload-progress");
  if (upload && bar && window.XMLHttpRequest && window.FormData) {
    upload.addEventListener("submit", function (event) {
      event.preventDefault();
      var xhr = new XMLHttpRequest();
      xhr.open("POST", upload.action);
      bar.hidden = false;
      xhr.upload.addEventListener("progress", function (e) {
        if (e.lengthComputable) {
          bar.value = Math.round((e.loaded / e.total) * 100);
          bar.textContent = bar.value + "%";
        }
      });
      xhr.addEventListener("load", function () {
        if (xhr.status >= 200 && xhr.status < 300 && xhr.responseURL) {
          window.location.assign(xhr.responseURL);
        } else {
          document.open();
          document.write(xhr.responseText);
          document.close();
        }
      });
      xhr.addEventListener("error", function () {
        bar.hidden = true;
        window.alert("The upload failed: the connection was lost.");
      });
      xhr.send(new FormData(upload));
    });
  }
  var pg = document.getElementById("playground");
  var out = document.getElementById("pg-answer");
  if (pg && out && window.fetch && window.TextDecoder && window.URLSearchParams) {
    pg.addEventListener("submit", function (event) {
      event.preventDefault();
      out.textContent = "";
      var button = pg.querySelector("button[type=submit]");
      button.disabled = true;
      var show = function (data) {
        if (data === "[DONE]") return;
        try {
          var j = JSON.parse(data);
          var choice = j.choices && j.choices[0];
          if (choice && choice.delta && choice.delta.content) out.textContent += choice.delta.content;
          else if (j.error) out.textContent += "\n" + (j.error.message || "The model failed.");
        } catch (err) { /* not JSON: skipped */ }
      };
      fetch("/console/playground/stream", {
        method: "POST",
        credentials: "same-origin",
        body: new URLSearchParams(new FormData(pg))
      }).then(function (res) {
        var type = res.headers.get("content-type") || "";
        // A page instead of the stream or a plain refusal: the session
        // ended (redirected to sign-in) or this page's form is stale.
        if (res.redirected || type.indexOf("text/html") === 0) {
          out.textContent = "Your session has ended or this page is out of date: reload the page (and sign in again if asked).";
          return;
        }
        if (!res.ok || !res.body) return res.text().then(function (t) { out.textContent = t; });
        var reader = res.body.getReader();
        var decoder = new TextDecoder();
        var buffer = "";
        var pump = function () {
          return reader.read().then(function (r) {
            if (r.done) return;
            buffer += decoder.decode(r.value, { stream: true });
            var events = buffer.split("\n\n");
            buffer = events.pop();
            events.forEach(function (e) { show(e.replace(/^data: /, "")); });
            return pump();
          });
        };
        return pump();
      }).catch(function () {
        out.textContent = "The connection was lost.";
      }).then(function () {
        button.disabled = false;
      });
    });
  }
});
