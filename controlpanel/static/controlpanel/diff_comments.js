/* Comments on a line of a diff (the run page, templates/admin/engine/run/detail.html): where the page has a
 * Request changes form, a click on a line of a diff (an added or unchanged line: data-cp-file, data-cp-line,
 * controlpanel/views/common.py render_diff) opens a small box under it; "Add comment" appends
 * "path:line: text" to the form's comments, one a line, and marks the line. Request changes sends them;
 * engine/diff_comments.py checks each against the files waiting for approval, and the repair attempt's
 * prompt shows each with the code around its line (engine/steps/prompts.py). */
(function () {
  "use strict";

  function commentsField() {
    return document.querySelector("form.cp-action-request_changes textarea[name=comments]");
  }

  function closeBox() {
    var open = document.querySelector(".cp-line-comment");
    if (open) {
      open.remove();
    }
  }

  function openBox(line) {
    closeBox();
    var path = line.getAttribute("data-cp-file"), number = line.getAttribute("data-cp-line");
    var box = document.createElement("span");
    box.className = "cp-line-comment";
    var label = document.createElement("label");
    label.textContent = "Comment on " + path + ":" + number;
    var area = document.createElement("textarea");
    area.rows = 3;
    area.setAttribute("aria-label", "Comment on " + path + " line " + number);
    label.appendChild(area);
    var add = document.createElement("button");
    add.type = "button";
    add.className = "button default cp-line-comment-add";
    add.textContent = "Add comment";
    var cancel = document.createElement("button");
    cancel.type = "button";
    cancel.className = "button cp-line-comment-cancel";
    cancel.textContent = "Cancel";
    box.appendChild(label);
    box.appendChild(add);
    box.appendChild(cancel);
    line.after(box);
    area.focus();
    cancel.addEventListener("click", closeBox);
    add.addEventListener("click", function () {
      var text = area.value.trim().replace(/\s*\n\s*/g, " ");
      var field = commentsField();
      if (!text || !field) {
        area.focus();
        return;
      }
      var before = field.value.replace(/\s+$/, "");
      // a path with a space or a colon goes in double quotes (engine/diff_comments.py parse_comment)
      var named = /[\s:"]/.test(path) ? "\"" + path + "\"" : path;
      field.value = (before ? before + "\n" : "") + named + ":" + number + ": " + text;
      line.classList.add("cp-commented");
      line.title = (line.title ? line.title + "\n" : "") + text;
      closeBox();
      var form = field.closest("form");
      if (form && form.querySelector("textarea[name=note]") && !form.querySelector("textarea[name=note]").value.trim()) {
        form.querySelector("textarea[name=note]").placeholder = "what must change overall (required)";
      }
    });
  }

  document.addEventListener("click", function (evt) {
    var line = evt.target.closest ? evt.target.closest(".cp-diff span[data-cp-line]") : null;
    if (!line || !commentsField() || String(window.getSelection ? window.getSelection() : "").length) {
      return;  // no line, no Request changes on this page, or the person is selecting text
    }
    openBox(line);
  });
})();
