"""One device's scan, in its own process (:mod:`.worker`): which case runs next within the budget
(:mod:`.schedule`), the retest of a failing case in a fresh process (:mod:`.retest`), the store writes that keep a
killed scan consistent (:mod:`.record`) and the summary the worker ends with (:mod:`.summary`)."""
