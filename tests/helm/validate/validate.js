// Validates every object of a rendered manifest (`helm template` output)
// against the Kubernetes and Prometheus Operator schemas of kubernetes-models,
// offline. Prints one JSON object: {"objects": [...parsed objects...],
// "errors": ["Kind/name: message", ...]}. Exits 1 when any object is invalid
// or of a kind this script has no model for.
//
//   NODE_PATH=.out/k8s-validate/node_modules node tests/helm/validate/validate.js rendered.yaml
"use strict";

const fs = require("fs");
const yaml = require("js-yaml");

// apiVersion -> the kubernetes-models module that holds its kinds.
const MODULES = {
  "v1": "kubernetes-models/v1",
  "apps/v1": "kubernetes-models/apps/v1",
  "batch/v1": "kubernetes-models/batch/v1",
  "policy/v1": "kubernetes-models/policy/v1",
  "networking.k8s.io/v1": "kubernetes-models/networking.k8s.io/v1",
  "monitoring.coreos.com/v1": "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1",
};

function validate(object) {
  const module = MODULES[object.apiVersion];
  if (!module) return `no schema for apiVersion ${object.apiVersion}`;
  const Model = require(module)[object.kind];
  if (!Model) return `no schema for kind ${object.kind} in ${object.apiVersion}`;
  try {
    new Model(object).validate();
  } catch (error) {
    return error.message;
  }
  return null;
}

function main() {
  if (process.argv.length !== 3) {
    console.error("usage: validate.js RENDERED.yaml");
    process.exit(2);
  }
  const objects = yaml.loadAll(fs.readFileSync(process.argv[2], "utf8")).filter((o) => o != null);
  const errors = [];
  for (const object of objects) {
    const error = validate(object);
    const name = object.metadata && object.metadata.name;
    if (error) errors.push(`${object.kind}/${name}: ${error}`);
  }
  if (objects.length === 0) errors.push("no objects rendered");
  process.stdout.write(JSON.stringify({objects, errors}) + "\n");
  process.exit(errors.length ? 1 : 0);
}

main();
