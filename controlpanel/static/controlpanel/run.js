/* The run detail page (templates/admin/engine/run/detail.html).
 *
 * cpIdle(): true while the person is not in the middle of an action, i.e. no field of an action
 * form has the focus or holds typed text. The page of an active run reloads itself when the run
 * changes (htmx poll of its state endpoint, filtered with this), never under someone's typing. */
function cpIdle() {
  var active = document.activeElement;
  if (active && active.closest && active.closest("form.cp-action")) {
    return false;
  }
  var fields = document.querySelectorAll("form.cp-action textarea, form.cp-action input[type=text]");
  for (var i = 0; i < fields.length; i++) {
    if (fields[i].value !== fields[i].defaultValue) {
      return false;
    }
  }
  return true;
}
