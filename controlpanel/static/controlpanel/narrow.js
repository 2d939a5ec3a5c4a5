/* Labels every cell of a list table with its column's heading (data-cp-label), for narrow.css: on a narrow
   screen a row is a block of "heading: value" lines. Tables: the admin's lists (#result_list) and the run
   page's (.cp-table), also those htmx puts in later. Loaded on every page (templates/admin/base_site.html). */
(function () {
  "use strict";

  function label(root) {
    (root || document).querySelectorAll("#result_list, table.cp-table").forEach(function (table) {
      var heads = Array.prototype.map.call(table.querySelectorAll(":scope > thead > tr > th"), function (th) {
        return th.textContent.trim();
      });
      table.querySelectorAll(":scope > tbody > tr").forEach(function (row) {
        if (row.querySelector(":scope > td[colspan]:not([colspan='1'])")) {
          return;  // a row of more (an attempt's conversation): no column of its own
        }
        Array.prototype.forEach.call(row.children, function (cell, index) {
          if (heads[index] && !cell.hasAttribute("data-cp-label")) {
            cell.setAttribute("data-cp-label", heads[index]);
          }
        });
      });
    });
  }

  document.addEventListener("DOMContentLoaded", function () { label(document); });
  document.addEventListener("htmx:afterSettle", function () { label(document); });
})();
