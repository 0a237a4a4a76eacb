// Package check holds the tests of kvmesh's deployment files, run by deploy/check.sh (make
// deploy-check): the Dockerfile and .dockerignore, the systemd unit, the Helm chart's rendered
// manifests, and the release configuration with the .deb it builds.
//
// It is a module of its own so that the Kubernetes API types and BuildKit's Dockerfile parser
// it decodes with never enter kvmesh's own dependency graph. Tests that need a tool (helm,
// nfpm) skip without it, unless KVMESH_DEPLOY_CHECK_STRICT=1, as deploy/check.sh sets after
// installing them, turns the skip into a failure.
package check
