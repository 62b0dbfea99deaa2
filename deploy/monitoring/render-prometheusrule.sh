#!/bin/sh
# Writes prometheusrule.yaml from rules/quotient.rules.yaml, the source of truth: the rule file's text, indented,
# becomes the PrometheusRule's spec. Run from anywhere after editing the rules; tests/integration/test_monitoring.py
# fails while the two differ.
set -eu
here=$(dirname "$0")
{
    cat <<'HEADER'
# GENERATED from rules/quotient.rules.yaml by render-prometheusrule.sh: edit the rule file, then run the script.
# The Prometheus Operator loads this into Prometheus; promtool tests the rule file itself (tests/).
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: quotient
  labels:
    app.kubernetes.io/name: quotient-scheduler
    app.kubernetes.io/component: monitoring
spec:
HEADER
    sed 's/^./  &/' "$here/rules/quotient.rules.yaml"
} > "$here/prometheusrule.yaml"
