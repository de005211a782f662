// Package deploy holds what runs hotcount in production, as files: the
// container image (Dockerfile), Kubernetes manifests (kubernetes/, a
// Kustomize base with hotcount as a native sidecar, an example overlay and a
// standalone pool), the Helm chart (helm/), the IAM policies (iam/), the table (table/) and the
// JetStream stream (nats/), and the operator pack (observability/: a
// Grafana dashboard, Prometheus alerting rules, a PodMonitor). Its tests
// render and check them, and the repository's compose.yaml (a local stack,
// built from the Dockerfile); see README.md.
package deploy
