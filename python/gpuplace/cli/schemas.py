"""The JSON Schema (draft 2020-12) of every command's ``--format json`` output.

One schema per output, named in :data:`SCHEMAS`; :data:`COMMANDS` says which schema each
command prints (``gpuplace schema`` lists them, ``gpuplace schema NAME`` prints one, and
docs/cli.md describes them). Every error, of every command, is the ``error`` schema. The tests
(tests/test_cli_json.py) validate each command's real output against its schema, so a key
that changes here or in a command fails there.

Objects list the keys a program may rely on as ``required``; outputs may carry more keys
(``additionalProperties`` is left open) so adding a field is not a breaking change. Units are
in the key names: ``_seconds`` / ``_s`` seconds, ``_gbps`` GB/s per direction, ``_w`` watts,
``_bytes`` / ``bytes_`` bytes.
"""

from __future__ import annotations

from typing import Any

__all__ = ["COMMANDS", "DIALECT", "SCHEMAS"]

DIALECT = "https://json-schema.org/draft/2020-12/schema"

Schema = dict[str, Any]

STR: Schema = {"type": "string"}
INT: Schema = {"type": "integer"}
NUM: Schema = {"type": "number"}
BOOL: Schema = {"type": "boolean"}
ANY_OBJECT: Schema = {"type": "object"}


def nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


def array(items: Schema) -> Schema:
    return {"type": "array", "items": items}


def mapping(values: Schema) -> Schema:
    """An object whose keys are names (jobs, levels, ...) and whose values are ``values``."""
    return {"type": "object", "additionalProperties": values}


def obj(required: dict[str, Schema], optional: dict[str, Schema] | None = None) -> Schema:
    """An object with these keys (``optional`` ones may be missing); other keys allowed."""
    return {
        "type": "object",
        "required": list(required),
        "properties": {**required, **(optional or {})},
    }


def enum(*values: str) -> Schema:
    return {"type": "string", "enum": list(values)}


def top(description: str, schema: Schema) -> Schema:
    return {"$schema": DIALECT, "description": description, **schema}


# ----------------------------------------------------------------------------- parts
HOT_UPLINK = obj(
    {
        "uplink": STR,
        "direction": enum("up", "down"),
        "capacity_gbps": NUM,
        "own_gbps": NUM,
        "others_gbps": NUM,
        "utilisation": NUM,
        "jobs": mapping(NUM),
    }
)

COST = obj(
    {
        "comm_seconds": NUM,
        "class_seconds": mapping(NUM),
        "class_algorithms": mapping(STR),
        "traffic_seconds": NUM,
        "bytes_by_level": mapping(NUM),
        "fabric_bytes": NUM,
        "span_level": nullable(STR),
        "confinement_ok": BOOL,
        "violations": array(STR),
        "step_seconds": nullable(NUM),
        "exposed_comm_seconds": nullable(NUM),
        "compute_seconds": nullable(NUM),
        "mfu": nullable(NUM),
        "tokens_per_second": nullable(NUM),
    },
    {
        "step": ANY_OBJECT,
        "io_seconds": NUM,
        "alone_seconds": NUM,
        "slowdown": NUM,
        "hot_uplinks": array(HOT_UPLINK),
    },
)

PLACEMENT_FIELDS: dict[str, Schema] = {
    "job": STR,
    "gpus": array(INT),
    "nodes": array(STR),
    "hostlist": STR,
    "cost": COST,
    "solver": STR,
    "optimal": nullable(BOOL),
    "bound": nullable(NUM),
    "gap": nullable(NUM),
    "elapsed_s": NUM,
}
PLACEMENT = obj(PLACEMENT_FIELDS, {"details": ANY_OBJECT})

CONSTRAINT = obj(
    {
        "kind": enum(
            "capacity",
            "pool",
            "exclusion",
            "power",
            "mig",
            "confinement",
            "span",
            "contention",
            "combination",
        ),
        "name": STR,
        "level": nullable(STR),
        "needed": INT,
        "available": INT,
        "binding": BOOL,
        "detail": STR,
    }
)

EXPLANATION_FIELDS: dict[str, Schema] = {
    "job": STR,
    "gpus": INT,
    "placeable": BOOL,
    "binding": array(STR),
    "constraints": array(CONSTRAINT),
    "solver_message": nullable(STR),
}
EXPLANATION = obj(EXPLANATION_FIELDS)
#: One peer's placement of the same job on the same state, priced by the same model.
COMPARISON = obj(
    {"solver": STR, "placement": ANY_OBJECT, "baseline": nullable(ANY_OBJECT)}, {"error": STR}
)

UPLINK_LOAD = obj(
    {
        "uplink": STR,
        "direction": enum("up", "down"),
        "load_gbps": NUM,
        "capacity_gbps": NUM,
        "utilisation": NUM,
    }
)

UPLINK_LEVEL = obj(
    {
        "level": STR,
        "uplinks_to": STR,
        "routing": enum("adaptive", "ecmp", "static", "sharp"),
        "directions": INT,
        "loaded": INT,
        "over_capacity": INT,
        "max_utilisation": NUM,
        "hottest": array(UPLINK_LOAD),
    }
)

JOB_HURT = obj(
    {"job": STR, "alone_seconds": NUM, "contended_seconds": NUM, "slowdown": NUM},
)

POWER_DOMAIN = obj(
    {
        "domain": STR,
        "kind": STR,
        "budget_w": NUM,
        "draw_w": NUM,
        "headroom_w": NUM,
        "synchronized_jobs": mapping(NUM),
    }
)

HEALTH_RECORD = obj(
    {"kind": STR, "name": STR, "condition": STR, "factor": NUM, "reason": STR},
)

TOPOLOGY_SUMMARY = obj(
    {
        "name": STR,
        "gpus": INT,
        "hosts": INT,
        "node_level": STR,
        "nvlink_domain": STR,
        "node_types": mapping(obj({"gpus": INT, "gpu_model": nullable(STR), "hosts": INT})),
        "levels": array(
            obj(
                {
                    "name": STR,
                    "bandwidth_gbps": NUM,
                    "latency_us": NUM,
                    "domains": INT,
                    "gpus_per_domain": obj({"min": INT, "max": INT}),
                    "role": enum("node", "below node", "above node"),
                    "nvlink_domain": BOOL,
                }
            )
        ),
        "degraded_links": array(ANY_OBJECT),
        "warnings": array(STR),
    },
    {"sources": array(STR)},
)

REPAIR_FIELDS: dict[str, Schema] = {
    "job": STR,
    "moved": array(obj({"rank": INT, "old_gpu": INT, "new_gpu": INT, "kind": STR, "reason": STR})),
    "cost_before": COST,
    "cost_after": COST,
    "elapsed_s": NUM,
    "placement": PLACEMENT,
}

STATE = nullable(STR)

# ----------------------------------------------------------------------------- outputs
SCHEMAS: dict[str, Schema] = {
    "error": top(
        "Any command's error with --format json (exit status 2; 130 when interrupted). "
        "class: a gpuplace error class (InvalidTopology, InvalidJob, InvalidState, "
        "Infeasible, ...), UsageError (the command line), CommandError, OSError (a file), "
        "Aborted or Interrupted; an Infeasible carries the explanation.",
        {
            **obj(
                {
                    "error": obj(
                        {"class": STR, "message": STR, "exit_code": INT},
                        {"explanation": EXPLANATION},
                    )
                }
            ),
            "additionalProperties": False,
        },
    ),
    "place": top(
        "gpuplace place: the placement (GPU of each rank, hosts, cost), the comparison with "
        "first-fit (comparison) and with each peer (comparisons: first-fit, slurm-tree), the "
        "flows crossing each fabric level and what hash collisions cost (fabric), and with "
        "--state what was allocated there.",
        obj(
            {
                **PLACEMENT_FIELDS,
                "cluster": STR,
                "comparison": COMPARISON,
                "comparisons": array(COMPARISON),
                "fabric": obj(
                    {
                        "levels": array(
                            obj(
                                {
                                    "level": STR,
                                    "routing": enum("adaptive", "ecmp", "static", "sharp"),
                                    "qps_per_connection": INT,
                                    "flows": NUM,
                                    "uplinks": INT,
                                    "links": INT,
                                    "fullest": NUM,
                                    "share": NUM,
                                }
                            )
                        ),
                        "seconds": NUM,
                        "balanced_seconds": NUM,
                        "slowdown": NUM,
                    }
                ),
                "state": STATE,
                "allocated": BOOL,
                "preempted": array(STR),
                "free_gpus": nullable(INT),
                "total_gpus": INT,
            },
            {"details": ANY_OBJECT},
        ),
    ),
    "lifecycle": top(
        "gpuplace release | cancel | requeue: the jobs stopped (running ones with the hosts "
        "they held, queued ones that left the queue), the queue after, free GPUs.",
        obj(
            {
                "action": enum("release", "cancel", "requeue"),
                "jobs": array(
                    obj(
                        {
                            "job": STR,
                            "was": enum("running", "queued"),
                            "gpus": INT,
                            "hosts": array(STR),
                        }
                    )
                ),
                "queue": array(STR),
                "free_gpus": INT,
                "total_gpus": INT,
                "state": STR,
            }
        ),
    ),
    "status": top(
        "gpuplace status: jobs running and queued, free capacity per level, unhealthy "
        "hardware, the fabric (jobs hurt, hottest uplinks overall and per level), power, pools.",
        obj(
            {
                "cluster": STR,
                "gpus": INT,
                "free": INT,
                "spares": INT,
                "failed_gpus": INT,
                "drained_gpus": INT,
                "degraded_gpus": INT,
                "jobs": array(
                    obj(
                        {"name": STR, "gpus": INT, "hosts": INT, "ranks_on_unusable_gpus": INT},
                        {"pool": STR, "priority_class": STR},
                    )
                ),
                "queue": array(obj({"job": STR, "gpus": INT, "reason": STR})),
                "levels": array(
                    obj(
                        {
                            "level": STR,
                            "domains": INT,
                            "free_gpus": INT,
                            "largest_free": INT,
                            "fully_free_domains": INT,
                        }
                    )
                ),
                "unhealthy": array(HEALTH_RECORD),
                "jobs_hurt": array(JOB_HURT),
                "hottest_uplinks": array(UPLINK_LOAD),
                "uplink_levels": array(UPLINK_LEVEL),
                "power": array(POWER_DOMAIN),
            },
            {
                "pools": array(
                    obj(
                        {
                            "pool": STR,
                            "gpus": INT,
                            "used": INT,
                            "lent": INT,
                            "borrowed": INT,
                            "free": INT,
                            "occupancy": NUM,
                        }
                    )
                )
            },
        ),
    ),
    "fabric": top(
        "gpuplace fabric: per uplink level (host NICs, leaf, spine, ...) its load and its "
        "hottest uplinks; the running jobs by slowdown.",
        obj({"cluster": STR, "levels": array(UPLINK_LEVEL), "jobs_hurt": array(JOB_HURT)}),
    ),
    "explain": top(
        "gpuplace explain: place's verdict for the solver, every constraint (needed, "
        "available, binding), and a summary line.",
        obj({**EXPLANATION_FIELDS, "solver": STR, "summary": STR}),
    ),
    "health-event": top(
        "gpuplace fail | drain | recover | degrade: the hardware named, the jobs hit (their "
        "ranks), free GPUs after.",
        obj(
            {
                "event": enum("fail", "drain", "recover", "degrade"),
                "targets": mapping(array(STR)),
                "affected": mapping(array(INT)),
                "free_gpus": INT,
                "total_gpus": INT,
                "state": STR,
            }
        ),
    ),
    "repair": top(
        "gpuplace repair: the ranks moved and why, the cost before and after, the placement.",
        obj({**REPAIR_FIELDS, "state": STR}, {"details": ANY_OBJECT}),
    ),
    "health-ingest": top(
        "gpuplace health ingest: per source its line counts, the findings, the changes with "
        "their reasons, the jobs hit and the repairs (with --follow: one object per batch, one "
        "per line).",
        obj(
            {
                "applied": BOOL,
                "sources": array(
                    obj(
                        {
                            "source": STR,
                            "format": STR,
                            "host": nullable(STR),
                            "lines": INT,
                            "evidence": INT,
                            "unknown_lines": INT,
                            "malformed_lines": INT,
                            "malformed": array(obj({"line": INT, "why": STR})),
                        }
                    )
                ),
                "findings": array(
                    obj(
                        {
                            "kind": STR,
                            "name": STR,
                            "condition": STR,
                            "factor": NUM,
                            "reason": STR,
                        }
                    )
                ),
                "changes": array(
                    obj({"kind": STR, "name": STR, "before": STR, "after": STR, "reason": STR})
                ),
                "unmapped": array(STR),
                "unchanged": array(STR),
                "affected": mapping(array(INT)),
                "repairs": array(obj(REPAIR_FIELDS)),
                "state": STR,
            }
        ),
    ),
    "policy-set": top(
        "gpuplace policy set: the pools, priority classes and attribute entries now in force.",
        obj(
            {
                "state": STR,
                "pools": array(STR),
                "priority_classes": array(STR),
                "attribute_entries": INT,
            }
        ),
    ),
    "policy-attributes": top(
        "gpuplace policy attributes: the attribute entries recorded for the host.",
        obj({"state": STR, "host": STR, "entries": array(ANY_OBJECT)}),
    ),
    "policy-show": top(
        "gpuplace policy show: the effective policy (docs/policy.md).",
        obj({"policy": ANY_OBJECT}),
    ),
    "mig-enable": top(
        "gpuplace mig enable: the GPUs put in MIG mode and the whole GPUs left free.",
        obj(
            {
                "state": STR,
                "model": STR,
                "mig_gpus": INT,
                "enabled": array(STR),
                "free_gpus": INT,
            }
        ),
    ),
    "mig-place": top(
        "gpuplace mig place: per request where it went (or why not), the compute left.",
        obj(
            {
                "placements": array(
                    obj(
                        {"request": STR, "placed": BOOL},
                        {
                            "how": STR,
                            "profile": STR,
                            "gpu": STR,
                            "slices": STR,
                            "reason": STR,
                        },
                    )
                ),
                "unallocated_gpus": NUM,
                "state": STR,
            }
        ),
    ),
    "mig-release": top(
        "gpuplace mig release: the requests released.",
        obj({"state": STR, "released": array(STR), "destroyed": BOOL}),
    ),
    "mig-status": top(
        "gpuplace mig status: per MIG GPU its instances and free compute slices.",
        obj(
            {
                "model": STR,
                "gpus": array(
                    obj(
                        {
                            "gpu": STR,
                            "instances": array(
                                obj({"profile": STR, "start": INT, "owner": nullable(STR)})
                            ),
                            "free_compute_slices": INT,
                            "compute_slices": INT,
                        }
                    )
                ),
                "unallocated_gpus": NUM,
            }
        ),
    ),
    "share-enable": top(
        "gpuplace share enable: the shared hosts (all of them) and the GPUs left for whole-GPU "
        "placement.",
        obj(
            {
                "state": STR,
                "hosts": array(STR),
                "gpus": INT,
                "mode": enum("fractional", "mig"),
                "free_gpus": INT,
            }
        ),
    ),
    "share-place": top(
        "gpuplace share place: per request its node, GPUs and MIG starts (or why not), the "
        "unallocated share of the shared GPUs and the reconfigurations so far.",
        obj(
            {
                "placements": array(
                    obj(
                        {"request": STR, "placed": BOOL},
                        {
                            "node": STR,
                            "gpus": array(INT),
                            "starts": array(INT),
                            "where": STR,
                            "reconfigured": INT,
                            "reason": STR,
                        },
                    )
                ),
                "placed": INT,
                "requests": INT,
                "unallocated_gpu_share": NUM,
                "reconfigurations": INT,
                "state": STR,
            }
        ),
    ),
    "share-release": top(
        "gpuplace share release: the requests released.",
        obj({"state": STR, "released": array(STR)}),
    ),
    "share-status": top(
        "gpuplace share status: per shared host its GPUs' modes and free milli-GPUs, CPU and "
        "memory left, and its requests.",
        obj(
            {
                "nodes": array(
                    obj(
                        {
                            "name": STR,
                            "model": nullable(STR),
                            "modes": array(enum("fractional", "mig")),
                            "gpu_left_milli": array(INT),
                            "cpu_left_milli": INT,
                            "memory_left_mib": INT,
                            "fragmentation_milli": NUM,
                            "requests": array(STR),
                        }
                    )
                ),
                "gpus": INT,
                "requests": INT,
                "used_gpu_milli": INT,
                "total_gpu_milli": INT,
                "unallocated_gpu_share": NUM,
                "reconfigurations": INT,
            }
        ),
    ),
    "fgd": top(
        "gpuplace fgd: per workload, per policy the unallocated GPUs (%) at the arrived share "
        "asked (median and per seed, the paper's median when published) and the decision time.",
        obj(
            {
                "figures": array(
                    obj(
                        {
                            "workload": STR,
                            "at_arrived_percent": INT,
                            "seeds": array(INT),
                            "nodes": INT,
                            "gpus": INT,
                            "seconds": NUM,
                            "unallocated_percent": mapping(
                                obj({"median": NUM, "seeds": array(NUM)}, {"paper": NUM})
                            ),
                            "decision_us": mapping(obj({"median": NUM, "p99": NUM, "max": NUM})),
                        }
                    )
                )
            },
            {"plot": STR},
        ),
    ),
    "k8s-export": top(
        "gpuplace k8s export: the files written and, with --job, the placement.",
        obj(
            {
                "cluster": STR,
                "directory": STR,
                "files": array(STR),
                "placement": nullable(PLACEMENT),
            }
        ),
    ),
    "slurm-sync": top(
        "gpuplace slurm sync: the files written (state, its topology, Slurm's partitions and "
        "reservations) and what the live cluster holds.",
        obj(
            {
                "state": STR,
                "topology": STR,
                "slurm_view": STR,
                "nodes": INT,
                "gpus": INT,
                "free_gpus": INT,
                "jobs": array(STR),
                "out_of_service": INT,
                "gres": BOOL,
                "partitions": array(STR),
                "reservations": array(STR),
            }
        ),
    ),
    "slurm-submit": top(
        "gpuplace slurm submit: the nodes chosen (in rank order), the exact sbatch command, its "
        "environment and files, and Slurm's job id (null with --dry-run).",
        obj(
            {
                "job": STR,
                "nodes": array(STR),
                "hostlist": STR,
                "gpus": INT,
                "argv": array(STR),
                "env": mapping(STR),
                "files": mapping(STR),
                "dry_run": BOOL,
                "job_id": nullable(INT),
            }
        ),
    ),
    "slurm-pick": top(
        "gpuplace slurm pick: the nodes gpuplace picks for the request, in rank order.",
        obj({"job": STR, "nodes": array(STR), "hostlist": STR, "gpus": INT}),
    ),
    "serve": top(
        "gpuplace serve: where it listens (Unix socket paths, http(s) URLs), the clusters it "
        "serves and its journal; one line once it listens, then it serves.",
        obj({"listening": array(STR), "clusters": array(STR), "journal": STR}),
    ),
    "service-place": top(
        "gpuplace service place: the service's placement (held unless --dry-run).",
        obj({"job": STR, "nodes": array(STR), "hostlist": STR, "gpus": array(INT)}),
    ),
    "service-release": top(
        "gpuplace service release: the job released and how many GPUs it gave back.",
        obj({"cluster": STR, "job": STR, "released_gpus": INT}),
    ),
    "service-repair": top(
        "gpuplace service repair: the repair proposed (or applied) for a job hit by failed "
        "hardware: the ranks that move and why.",
        obj(
            {"applied": BOOL},
            {"moved": array(obj({"rank": INT, "reason": STR}))},
        ),
    ),
    "service-explain": top(
        "gpuplace service explain: whether the job fits the live state, and each constraint "
        "with the binding ones marked (as gpuplace explain).",
        obj(
            {
                "job": STR,
                "placeable": BOOL,
                "constraints": array(
                    obj({"kind": STR, "name": STR, "detail": STR, "binding": BOOL})
                ),
            }
        ),
    ),
    "service-status": top(
        "gpuplace service status: each cluster's GPUs, jobs (with holds) and unhealthy "
        "hardware, its Slurm follower, and the journal.",
        obj(
            {
                "clusters": array(
                    obj(
                        {
                            "cluster": STR,
                            "gpus": INT,
                            "free_gpus": INT,
                            "jobs": mapping(ANY_OBJECT),
                            "unhealthy": array(ANY_OBJECT),
                        },
                        {"slurm": ANY_OBJECT},
                    )
                ),
                "journal": obj({"committed": INT}),
            }
        ),
    ),
    "service-health": top(
        "gpuplace service health: the health changes the evidence made, the jobs they hit and "
        "their repairs, and what the scheduler was told (drained nodes).",
        obj(
            {
                "cluster": STR,
                "changes": array(obj({"kind": STR, "name": STR, "before": STR, "after": STR})),
                "repairs": mapping(ANY_OBJECT),
            },
            {"scheduler": array(ANY_OBJECT)},
        ),
    ),
    "k8s-extender": top(
        "gpuplace k8s extender: the address it listens on (one line, then it serves).",
        obj({"listening": STR, "verbs": array(STR)}),
    ),
    "topo-import": top(
        "gpuplace topo import: the topology's summary, and without -o the topology itself "
        "(docs/topology-format.md).",
        obj(
            {
                "output": nullable(STR),
                "summary": TOPOLOGY_SUMMARY,
                "topology": nullable(ANY_OBJECT),
            }
        ),
    ),
    "topo-show": top(
        "gpuplace topo show: GPUs, hosts, levels with bandwidths, domain counts and sizes.",
        TOPOLOGY_SUMMARY,
    ),
    "topo-export": top(
        "gpuplace topo export: Slurm topology.conf, as text when not written to a file.",
        obj({"output": nullable(STR), "mode": enum("tree", "block"), "text": nullable(STR)}),
    ),
    "presets": top(
        "gpuplace presets: the built-in clusters with their parameters and defaults, and the "
        "topology options every command takes as -p KEY=VALUE.",
        obj(
            {
                "presets": array(
                    obj({"name": STR, "description": STR, "parameters": mapping(INT)})
                ),
                "options": array(STR),
            }
        ),
    ),
    "solvers": top(
        "gpuplace solvers: the registered solvers.",
        obj({"solvers": array(obj({"name": STR, "description": STR}))}),
    ),
    "schema-list": top(
        "gpuplace schema (no NAME): the schemas, and which one each command prints.",
        obj({"schemas": array(STR), "commands": mapping(STR)}),
    ),
    "calibrate": top(
        "gpuplace calibrate: every fitted parameter before and after (a routing by name), "
        "every routing tried on each level the samples cross with the rms log error of its "
        "fit, each sample's error before and after, the rms log error, the file written.",
        obj(
            {
                "output": STR,
                "parameters": array(
                    obj(
                        {
                            "parameter": STR,
                            "before": {"anyOf": [NUM, STR, {"type": "null"}]},
                            "after": {"anyOf": [NUM, STR, {"type": "null"}]},
                            "changed": BOOL,
                        }
                    )
                ),
                "routing": array(
                    obj(
                        {
                            "level": STR,
                            "routing": enum("adaptive", "ecmp", "static"),
                            "qps_per_connection": INT,
                            "rms_log_error": NUM,
                            "chosen": BOOL,
                        }
                    )
                ),
                "samples": array(
                    obj(
                        {
                            "sample": STR,
                            "gpus": INT,
                            "measured_seconds": NUM,
                            "error_before": NUM,
                            "error_after": NUM,
                        }
                    )
                ),
                "rms_log_error": obj({"before": NUM, "after": NUM}),
            }
        ),
    ),
    "bench": top(
        "gpuplace bench: every solver on every instance, the summary per solver, greedy's "
        "ratios on fragmented states, the files written.",
        obj(
            {
                "seed": INT,
                "solvers": array(STR),
                "results": array(
                    obj(
                        {
                            "cluster": STR,
                            "occupancy": NUM,
                            "job": STR,
                            "solver": STR,
                            "status": STR,
                            "comm_seconds": nullable(NUM),
                        }
                    )
                ),
                "summary": mapping(ANY_OBJECT),
                "greedy_vs": mapping(ANY_OBJECT),
                "files": array(STR),
            }
        ),
    ),
    "bench-contention": top(
        "gpuplace bench --contention: a new job on loaded 2:1 fabrics, every solver priced "
        "with its neighbours, and the summary per solver.",
        obj(
            {
                "solvers": array(STR),
                "results": array(
                    obj(
                        {
                            "cluster": STR,
                            "job": STR,
                            "solver": STR,
                            "status": STR,
                            "slowdown": nullable(NUM),
                        }
                    )
                ),
                "summary": mapping(ANY_OBJECT),
                "files": array(STR),
            }
        ),
    ),
    "simulate": top(
        "gpuplace simulate: per run (policy, solver, seed, cluster) its summary metrics.",
        mapping(
            obj(
                {
                    "jobs": INT,
                    "jobs_finished": INT,
                    "makespan_s": NUM,
                    "utilization": NUM,
                    "goodput": NUM,
                    "mfu": nullable(NUM),
                    "jct_mean_s": nullable(NUM),
                    "jct_p99_s": nullable(NUM),
                    "queue_mean_s": nullable(NUM),
                    "gpu_hours_lost": NUM,
                    "solver": STR,
                    "policy": STR,
                    "cluster": STR,
                    "gpus": INT,
                }
            )
        ),
    ),
}

#: The schema of each command's ``--format json`` output (errors: ``error``, every command).
COMMANDS: dict[str, str] = {
    "place": "place",
    "release": "lifecycle",
    "cancel": "lifecycle",
    "requeue": "lifecycle",
    "status": "status",
    "fabric": "fabric",
    "explain": "explain",
    "fail": "health-event",
    "drain": "health-event",
    "recover": "health-event",
    "degrade": "health-event",
    "repair": "repair",
    "health ingest": "health-ingest",
    "policy set": "policy-set",
    "policy attributes": "policy-attributes",
    "policy show": "policy-show",
    "mig enable": "mig-enable",
    "mig place": "mig-place",
    "mig release": "mig-release",
    "mig status": "mig-status",
    "share enable": "share-enable",
    "share place": "share-place",
    "share release": "share-release",
    "share status": "share-status",
    "fgd": "fgd",
    "k8s export": "k8s-export",
    "k8s extender": "k8s-extender",
    "slurm sync": "slurm-sync",
    "slurm submit": "slurm-submit",
    "slurm pick": "slurm-pick",
    "serve": "serve",
    "service place": "service-place",
    "service release": "service-release",
    "service repair": "service-repair",
    "service explain": "service-explain",
    "service status": "service-status",
    "service health": "service-health",
    "topo import": "topo-import",
    "topo show": "topo-show",
    "topo export": "topo-export",
    "presets": "presets",
    "solvers": "solvers",
    "schema": "schema-list",
    "calibrate": "calibrate",
    "bench": "bench",
    "bench --contention": "bench-contention",
    "simulate": "simulate",
}
