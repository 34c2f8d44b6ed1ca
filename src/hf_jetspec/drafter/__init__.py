"""The drafter model: its configuration, layers, masks, Jacobi refinement, caches, weight storage and
int8/compiled drafting steps, and what it needs to know about a target.

Import from the modules (``hf_jetspec.drafter.modeling_drafter``) or from ``hf_jetspec``; this
package file imports nothing, so the foresight models can share the low modules without a cycle."""
