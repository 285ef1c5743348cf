"""What each ``KVPnnn`` code means and how to fix it: the one list ``docs/reference/codes.md``
is generated from (``python tools/gen_reference.py``; ``tests/test_reference_docs.py`` fails
when a :class:`~kvplan.schemas.errors.Code` has no entry here). The diagnostic itself names the
layer or field and usually a more precise fix; this is the code's general meaning."""

from __future__ import annotations

from kvplan.schemas.errors import Code

SECTIONS: tuple[tuple[str, str], ...] = (
    ("KVP0", "Reading and writing documents"),
    ("KVP1", "Input documents: layers, groups, tensors"),
    ("KVP2", "Aliases (KV sharing)"),
    ("KVP3", "Plans: pools and views"),
    ("KVP4", "Execution, options and elastic files"),
    ("KVP5", "The vLLM plugin, elastic mode and groups"),
    ("KVP6", "Legacy layouts (vLLM 0.22-0.28, kvcached)"),
)

CODE_DOCS: dict[Code, tuple[str, str]] = {
    Code.MALFORMED: ("the file is not valid JSON or YAML", "fix the syntax at the line shown"),
    Code.UNREADABLE: ("the file cannot be read", "check the path and its permissions"),
    Code.WRONG_FORMAT: (
        "the document's `format` is not the one the command reads",
        "give an input document (`kvplan.input/1`) or a plan (`kvplan.plan/1`) as asked",
    ),
    Code.SCHEMA: (
        "a field is missing, of the wrong type or out of its range",
        "compare with `kvplan schema input|plan`",
    ),
    Code.UNKNOWN_SPEC_KIND: ("a KV cache spec kind kvplan does not know", "use a listed kind"),
    Code.UNKNOWN_DTYPE: ("a dtype kvplan does not know", "use a torch dtype name (`bfloat16`)"),
    Code.UNKNOWN_LAYOUT: ("a tensor layout kvplan does not know", "use a listed layout"),
    Code.UNKNOWN_ENUM: ("a value outside a field's choices", "use one of the values listed"),
    Code.TOO_DEEP: ("the document nests too deeply", "flatten it; real documents are shallow"),
    Code.NUMBER_OUT_OF_RANGE: ("a number too large to be meaningful", "fix the number"),
    Code.DUPLICATE_KEY: ("a key appears twice in one mapping", "keep one of them"),
    Code.ALIAS_EXPANSION: ("YAML aliases expand past the bound", "write the values out"),
    Code.BAD_ENCODING: ("the file is not UTF-8 text", "save it as UTF-8 without a BOM"),
    Code.TOO_LARGE: ("the file is larger than kvplan reads", "give the real document"),
    Code.EMPTY_DOCUMENT: ("the file is empty", "give a document"),
    Code.OUTPUT_FAILED: ("the output could not be written", "check free space and permissions"),
    Code.OUTPUT_IS_INPUT: ("`-o` names an input of the command", "write to another file"),
    Code.STDOUT_FAILED: ("standard output is closed or full", "give `-o FILE`"),
    Code.INTERNAL: ("a kvplan bug", "report it with `KVPLAN_TRACEBACK=1`'s output"),
    Code.BAD_SIZE: ("a size kvplan cannot read", "write e.g. `24GiB`, `512MiB` or bytes"),
    Code.UNKNOWN_SCHEMA: ("`kvplan schema` of an unknown name", "use input, legacy or plan"),
    Code.NOT_REGULAR_FILE: (
        "a fifo, socket or device given as a file to read, or a read that would block",
        "give a regular file",
    ),
    Code.UNSAFE_OUTPUT: (
        "a link, fifo, socket or device where a file is written, a path outside the directory "
        "kvplan keeps files in, or standard output as an output file",
        "write to a regular file path",
    ),
    Code.NOTHING_TO_CHECK: (
        "`golden check`/`update` of a directory with no golden model",
        "record one with `kvplan golden add`",
    ),
    Code.NAME_TOO_LONG: ("a string longer than 256 characters", "shorten the name"),
    Code.TOO_MANY_ITEMS: (
        "more than 16,384 layers, views, aliases, pools, groups or tensors, or 16 dimensions",
        "give a real model's document",
    ),
    Code.BUNDLE_MISMATCH: (
        "a `kvplan inspect` bundle whose plan is not its input's",
        "run `kvplan inspect` again rather than editing the bundle",
    ),
    Code.BAD_NUM_BLOCKS: ("`num_blocks` is not positive", "dump the document from vLLM again"),
    Code.EMPTY_TENSOR: ("a KV cache tensor of size 0", "dump the document from vLLM again"),
    Code.TENSOR_SIZE_MISMATCH: (
        "a tensor's size is not what its layers' page sizes and `num_blocks` make",
        "check the tensor's size and the group's page size",
    ),
    Code.LAYER_NOT_IN_GROUP: ("a tensor's layer is in no KV cache group", "add it to a group"),
    Code.LAYER_UNBOUND: ("a layer has no tensor and no alias", "bind it or alias it"),
    Code.LAYER_BOUND_TWICE: ("a layer is in two tensors", "keep it in one"),
    Code.SIZE_NOT_PAGE_MULTIPLE: (
        "a tensor's size is not a multiple of its page size",
        "check `num_blocks` and the page size",
    ),
    Code.PADDED_PAGE_TOO_SMALL: (
        "a padded page is smaller than the page it pads",
        "fix `page_size_padded`",
    ),
    Code.MISSING_LAYER_SPEC: ("a layer of a group has no spec", "add the layer's spec"),
    Code.KERNEL_BLOCK_MISMATCH: (
        "a kernel block size does not divide the block size",
        "use the kernel block sizes vLLM resolved",
    ),
    Code.KERNEL_SPLIT_NOT_DENSE: (
        "kernel blocks that do not tile the block densely",
        "use the kernel block sizes vLLM resolved",
    ),
    Code.KERNEL_BLOCK_SIZES_LENGTH: (
        "`kernel_block_sizes` has not one entry per group",
        "give one per KV cache group",
    ),
    Code.DUPLICATE_GROUP_LAYER: ("a layer listed twice in one group", "list it once"),
    Code.LAYOUT_MISSING: ("a group's tensor layout is missing", "capture the layout from vLLM"),
    Code.PAGE_GRID_INVALID: ("a page grid that does not fit its tensor", "fix the page grid"),
    Code.ALIAS_TARGET_MISSING: (
        "an alias's target is in no KV cache group or tensor",
        "fix the target name (vLLM names look like `model.layers.13.self_attn.attn`)",
    ),
    Code.ALIAS_TARGET_NOT_BACKED: (
        "an alias's target owns no memory",
        "point it at a layer that has a view",
    ),
    Code.ALIAS_CHAIN: ("an alias points at another alias", "point it at the owning layer"),
    Code.ALIAS_CYCLE: ("aliases form a cycle", "break the cycle; one layer must own the KV"),
    Code.ALIAS_SELF: ("a layer aliases itself", "remove the alias"),
    Code.ALIAS_KIND_MISMATCH: (
        "an alias joins layers of different spec kinds",
        "alias layers of the same kind",
    ),
    Code.ALIAS_ALSO_BOUND: ("a layer is both aliased and bound", "keep one of the two"),
    Code.VIEW_OUT_OF_BOUNDS: ("a view reaches outside its pool", "fix its offset, shape or stride"),
    Code.VIEW_OVERLAP: ("two views of one group share bytes", "fix their offsets or strides"),
    Code.MISALIGNED: ("a view's offset is not aligned to its dtype", "align the offset"),
    Code.OVERFLOW: ("a view's bytes are not 64-bit addressable", "fix its shape and strides"),
    Code.UNKNOWN_POOL: ("a view names a pool the plan does not have", "fix the pool name"),
    Code.DUPLICATE_VIEW: ("two views, or two aliases, for one layer", "keep one"),
    Code.BAD_VIEW_SHAPE: (
        "a view without one non-negative size and stride per dimension",
        "fix the shape and strides",
    ),
    Code.POOL_NOT_GRANULAR: (
        "(warning) a pool that is not a multiple of the backend's granularity",
        "nothing to do unless `KVPLAN_STRICT` is set; the last chunk is rounded up",
    ),
    Code.OVERLAP_UNPROVEN: ("reserved: no longer emitted (overlap is decided exactly)", "-"),
    Code.VIEW_SELF_OVERLAP: (
        "two blocks or elements of one view share bytes",
        "make the block stride at least a page",
    ),
    Code.OVERLAP_UNDECIDED: (
        "a hand-written plan exceeds the overlap check's work bound",
        "simplify the views (vLLM layouts have one progression per view)",
    ),
    Code.DUPLICATE_POOL: ("two pools with one name", "rename one"),
    Code.BACKEND_UNAVAILABLE: (
        "the backend cannot run here (no CUDA driver, no cuda-python, no torch)",
        "install what `kvplan doctor` names, or choose another backend",
    ),
    Code.DRIVER_CALL_FAILED: (
        "a driver call failed while binding (out of memory, a bad handle)",
        "read the driver's error; free device memory or lower the limit",
    ),
    Code.VERIFY_MISMATCH: (
        "the bound tensors do not match the plan",
        "report it: the binding is not what was planned",
    ),
    Code.BLOCK_OUT_OF_RANGE: ("`apply --blocks` names blocks outside the plan", "fix the ids"),
    Code.OPTION_OUT_OF_RANGE: ("an option's value is out of range", "use a value in range"),
    Code.USAGE: ("a command used wrongly (unknown option, missing value)", "see `--help`"),
    Code.CLOSE_INCOMPLETE: (
        "`close()` could not release everything",
        "call `close()` again",
    ),
    Code.TOO_MANY_CHUNKS: (
        "an eager `apply` whose chunk size needs more than 1,048,576 mappings",
        "use a larger `--chunk`",
    ),
    Code.STATS_UNREADABLE: (
        "a `rank<N>.stats.json` cannot be read or is not a stats document",
        "`kvplan top` shows the other ranks; check the file",
    ),
    Code.LIMIT_UNREADABLE: (
        "a `limit.json` cannot be read or is not a limit request",
        "write it again with `kvplan limit`",
    ),
    Code.BAD_LIMIT: ("a cache limit above the limit, or a negative size", "lower the cache limit"),
    Code.DIRECTORY_MISSING: (
        "`kvplan top`/`limit`: the directory does not exist",
        "give the engine's `KVPLAN_DUMP_DIR` or a group directory",
    ),
    Code.STATS_PLAN_MISMATCH: (
        "(warning) `kvplan top --html`: a rank's plan is missing or is not its stats' plan",
        "the page shows that rank without its pages; restart the engine to dump it again",
    ),
    Code.LIMIT_BELOW_FLOOR: (
        "(warning) `kvplan limit` below an engine's floor, which raises it to the floor",
        "give a limit at or above the floor `kvplan top` shows",
    ),
    Code.UNTRUSTED: (
        "a dump, plan or group directory (or a file in it) another user could write or owns: "
        "kvplan reads commands there, so it refuses it and names the owner",
        "make the directory the engine user's (or root's) and not writable by others, or "
        "sticky with files of that user only (`chmod`/`chown` as the message says)",
    ),
    Code.LIMIT_NO_ENGINES: (
        "`kvplan limit DIR` where no engine dumps: a `limit.json` there would be read by none",
        "name the directory `kvplan top` shows the engines in, `--group DIR` for a group's "
        "budget, or `KVPLAN_MEMORY_LIMIT` for an engine not started yet",
    ),
    Code.INTEGRATION: (
        "the plugin cannot bind this engine (a bad setting, an unsupported vLLM, a failed check)",
        "read the reason and run `kvplan doctor`; kvplan never falls back silently",
    ),
    Code.RANK_UNKNOWN: ("a worker whose rank cannot be told", "report the executor used"),
    Code.REVIEWED_PLAN_DIFFERS: (
        "the live plan differs from the reviewed one in `KVPLAN_PLAN_DIR`",
        "review the diff and update the golden plans (`kvplan golden update`)",
    ),
    Code.REVIEWED_PLAN_MISSING: (
        "`KVPLAN_PLAN_DIR` is not a directory of reviewed plans, or lacks this rank's",
        "point it at a directory `kvplan golden` wrote, or unset it",
    ),
    Code.FIELD_NOT_IN_RELEASE: (
        "the installed vLLM lacks a field kvplan reads",
        "use a supported vLLM release (`kvplan doctor`)",
    ),
    Code.FOREIGN_WRAPPER: (
        "a function the plugin wraps was already wrapped by another plugin",
        "disable the other plugin, or kvplan",
    ),
    Code.CACHE_REBOUND: (
        "a layer holds a KV tensor other than the one kvplan bound and verified (the message "
        "names vLLM 0.34's own extensible KV cache when it rebound the layers)",
        "find what rebinds the KV cache after start-up (another plugin, a patch); for vLLM's "
        "extensible KV cache, `--no-enable-extensible-kv-cache`",
    ),
    Code.EXTENSIBLE_KV_CACHE: (
        "vLLM 0.34's extensible KV cache was asked for (`--enable-extensible-kv-cache`), or "
        "reached an allocation, while kvplan binds the KV cache",
        "drop `--enable-extensible-kv-cache` (with kvplan on, it is turned off at start-up), "
        "or run without kvplan",
    ),
    Code.FEATURE_REFUSED: (
        "a vLLM feature kvplan cannot bind beside yet is on (sleep mode: vLLM's CuMem "
        "allocator must own the KV cache's memory); the message names it",
        "drop the feature's flag, or run without kvplan (the feature table: guides/features.md)",
    ),
    Code.REMOTE_CODE_REQUIRED: (
        "the model needs its own code",
        "add `--trust-remote-code` if you trust it",
    ),
    Code.REMOTE_CODE_UNAVAILABLE: (
        "the model's remote code is not available offline",
        "download the model's code, or inspect another model",
    ),
    Code.ELASTIC_UNSUPPORTED: (
        "elastic mode cannot serve this engine (release, backend or feature)",
        "set `KVPLAN_MODE=eager`",
    ),
    Code.ELASTIC_GEOMETRY: (
        "scheduler and workers derived different pages for a block",
        "report the model and settings; set `KVPLAN_MODE=eager` meanwhile",
    ),
    Code.ELASTIC_MAP_FAILED: (
        "the device could not back a map; the requests that needed it are preempted",
        "lower the limit or free device memory; the engine retries",
    ),
    Code.ELASTIC_LIMIT_TOO_SMALL: (
        "`KVPLAN_MEMORY_LIMIT` cannot hold one request of `max_model_len` tokens",
        "raise the limit to the floor `kvplan doctor` prints, or lower `--max-model-len`",
    ),
    Code.ELASTIC_REQUEST_UNSERVABLE: (
        "a request that cannot start while the group's accounting fails",
        "fix the group directory (`kvplan doctor`); the request finished with an error",
    ),
    Code.GROUP_UNREACHABLE: (
        "a group directory missing, a link, not owned by you or open to others, or its lock "
        "not obtained in time",
        "point `KVPLAN_GROUP` at a private directory you own (e.g. under `/dev/shm`)",
    ),
    Code.GROUP_LEDGER_INVALID: (
        "a group's `ledger.json` is missing, too large, not a ledger or breaks the rules",
        "stop the group's engines and remove the directory; never edit the ledger",
    ),
    Code.GROUP_GUARANTEES_EXCEED_BUDGET: (
        "the sum of guarantees would exceed the budget",
        "raise the budget (`kvplan limit --group`) or lower a guarantee",
    ),
    Code.GROUP_MEMBER_REFUSED: (
        "a live member has the name, the name is invalid, or the group is full",
        "give the engine another name (`KVPLAN_ENGINE_NAME`)",
    ),
    Code.GROUP_BUDGET_MISSING: (
        "a group without a ledger joined without a budget",
        "set `KVPLAN_GROUP_BUDGET` or run `kvplan limit --group DIR SIZE` first",
    ),
    Code.GROUP_LEASE_LOST: (
        "a member's lease was replaced or the member left the ledger",
        "restart the engine; nothing else may write in the group directory",
    ),
    Code.GROUP_NOT_GRANTED: (
        "bytes a member must have (its floor) were not granted in time",
        "raise the group's budget or stop another member",
    ),
    Code.GROUP_BAD_REQUEST: (
        "a group operation's value is out of range (a guarantee below the floor ...)",
        "use a value between the member's floor and ceiling",
    ),
    Code.GROUP_SPANS_NODES: (
        "an engine whose ranks run on several nodes cannot join a group",
        "unset `KVPLAN_GROUP` for that engine: a group is one host's memory",
    ),
    Code.LEGACY_LAYER_UNBACKED: ("a legacy layer with no memory", "check the legacy document"),
    Code.POOL_COUNT_MISMATCH: (
        "the strategy made a different number of pools than the release",
        "choose the `--strategy` of the release",
    ),
    Code.CONTIGUOUS_KERNEL_SPLIT: (
        "a kernel block split the contiguous legacy layout cannot express",
        "plan it with vLLM 0.29 or later",
    ),
    Code.LEGACY_SPEC_UNSUPPORTED: (
        "a spec kind the legacy layout does not support",
        "plan it with vLLM 0.29 or later",
    ),
    Code.KVCACHED_UNSUPPORTED: (
        "a model kvcached's layout cannot hold",
        "use `--strategy vanilla`",
    ),
    Code.BACKEND_SHAPE_MISMATCH: (
        "the backend's tensor shape differs from the plan's",
        "plan with the backend's layout",
    ),
    Code.VIRTUAL_CAPACITY_TOO_SMALL: (
        "`--virtual-capacity` is below what the model needs",
        "raise `--virtual-capacity`",
    ),
    Code.LEGACY_RELEASE_UNSUPPORTED: (
        "a legacy vLLM release kvplan does not model",
        "use a release listed in docs/versions.md",
    ),
    Code.LEGACY_RELEASE_MISMATCH: (
        "the document's release and the strategy's disagree",
        "give the release the document was dumped from",
    ),
    Code.LEGACY_RELEASE_UNMODELLED: (
        "a feature of this release kvplan's legacy model does not reproduce",
        "plan this model with a release whose binding kvplan reproduces",
    ),
}
