"""The checkpoint row and its rules: the values, the tables, the statuses, the requests' rules, the errors and the options."""
