//! `intentfs mcp`: an MCP server over stdio (the official Rust SDK, rmcp) for the agent
//! inside the mount. The agent's client starts it from the workspace it works in, so it is
//! one of the agent's processes: it finds its mount by walking up from its directory, and
//! does everything through the control files, where the daemon answers for the identity of
//! the process asking. It declares nothing to the daemon and holds no privilege.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, ContentBlock, Implementation, ListResourcesResult, PaginatedRequestParams,
    ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, Resource,
    ResourceContents, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_handler, tool_router, ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde::Deserialize;
use serde_json::{json, Value};

use super::agent::{errno_text, error, Governed};

#[derive(clap::Args, Debug)]
#[command(after_long_help = "SETUP:
  intentfs init claude-code        # writes .mcp.json (and the hooks) into the workspace
  intentfs init codex | gemini     # the same for Codex CLI, Gemini CLI
  intentfs init generic --print    # the JSON any MCP client takes

The agent's client starts `intentfs mcp` itself, over stdio, inside the mount. Run the agent
in an identity of its own (`intentfs run --intents all --agent claude --user agent -- claude`):
the server answers for that identity, since the daemon knows which process asks.

TOOLS:
  list_intents                      the intents the agent may select, and the one selected
  select_active_intent(intent_id)   select one; answers its <intent_context>
  get_last_error                    the agent's latest refusal: code, path, message, remedy
  get_status                        the mount, identities, pending approvals, counters
  check_path(path, operation)       would this be allowed? (nothing recorded)
  request_approval(path, operation, reason)
                                    ask a human ahead; returns once decided
  get_lessons                       lessons from failed verifications (the lessons file)

RESOURCES: intentfs://intents/ID for each intent, intentfs://context, intentfs://last_error.")]
pub struct McpArgs {
    /// Serve the mount holding this directory [default: the current directory].
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// What the server knows: the mount, and the directory relative paths are taken from.
#[derive(Clone)]
struct Server {
    g: Arc<Governed>,
    cwd: PathBuf,
    tool_router: ToolRouter<Server>,
}

#[derive(Deserialize, rmcp::schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct SelectArgs {
    /// The id of the intent to work under, as list_intents gives it (e.g. "INT-001").
    intent_id: String,
}

#[derive(Deserialize, rmcp::schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct CheckArgs {
    /// The file or directory, relative to the workspace root (or absolute inside the mount).
    path: String,
    /// What you want to do: write (the default), create, delete, rename, mkdir, rmdir, read,
    /// truncate, chmod.
    #[serde(default)]
    operation: Option<String>,
}

#[derive(Deserialize, rmcp::schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct ApprovalArgs {
    /// The file or directory, relative to the workspace root (or absolute inside the mount).
    path: String,
    /// What you want to do: write (the default), create, delete, rename, read, ...
    #[serde(default)]
    operation: Option<String>,
    /// Why the task needs it, in one or two sentences, for the human who decides.
    reason: String,
}

/// A tool's answer: JSON, flagged as an error when it is one.
fn result(v: Value, is_error: bool) -> CallToolResult {
    if is_error {
        CallToolResult::structured_error(v)
    } else {
        CallToolResult::structured(v)
    }
}

/// The mount is gone or unreadable: say what and how to fix it.
fn unavailable(e: anyhow::Error) -> CallToolResult {
    result(
        error(
            "MOUNT_UNAVAILABLE",
            format!("{e:#}"),
            "The intentfs mount cannot be read: tell the human (is the mount still there? \
             `intentfs status`, `mount | grep intentfs`).",
        ),
        true,
    )
}

impl Server {
    /// Run `f` off the async runtime: every control file read or write is a blocking
    /// syscall on the mount, and `request_approval` waits for a human.
    async fn blocking<F>(&self, f: F) -> CallToolResult
    where
        F: FnOnce(&Governed, &Path) -> CallToolResult + Send + 'static,
    {
        let (g, cwd) = (self.g.clone(), self.cwd.clone());
        match tokio::task::spawn_blocking(move || f(&g, &cwd)).await {
            Ok(r) => r,
            Err(e) => unavailable(anyhow::anyhow!("the tool failed: {e}")),
        }
    }
}

/// The intent ids the caller may select: the policy's selectable intents, narrowed to
/// those the operator allowed this identity (`session`).
fn selectable(g: &Governed) -> anyhow::Result<Vec<String>> {
    let all: Vec<String> = g.intents()?.into_iter().map(|(id, _, _)| id).collect();
    let (_, _, allowed) = g.session()?;
    let allowed = allowed.trim();
    if allowed == "all" {
        return Ok(all);
    }
    let listed: Vec<&str> = allowed
        .trim_end_matches("(locked)")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    Ok(all
        .into_iter()
        .filter(|id| listed.contains(&id.as_str()))
        .collect())
}

fn list_intents(g: &Governed) -> anyhow::Result<Value> {
    let (identity, agent, allowed) = g.session()?;
    let selected = g.read("intent")?.trim().to_string();
    let selectable = selectable(g)?;
    let intents: Vec<Value> = g
        .intents()?
        .into_iter()
        .map(|(id, name, globs)| {
            json!({
                "id": id,
                "name": name,
                "owned_scope": globs,
                "selectable_by_you": selectable.contains(&id),
                "selected": id == selected,
            })
        })
        .collect();
    Ok(json!({
        "identity": identity,
        "agent": agent,
        "allowed": allowed,
        "selected": (!selected.is_empty()).then_some(selected),
        "intents": intents,
        "next": if selectable.is_empty() {
            "No intent can be selected by you: ask the human to start you with one."
        } else {
            "Call select_active_intent with one of the ids selectable_by_you before changing files."
        },
    }))
}

#[tool_router]
impl Server {
    fn new(g: Governed, cwd: PathBuf) -> Server {
        Server {
            g: Arc::new(g),
            cwd,
            tool_router: Self::tool_router(),
        }
    }

    #[tool(
        description = "List the intents (tasks) of this governed workspace: id, name, owned_scope (the globs \
                       you may change under it), whether you may select it, and the one selected now. Call \
                       this first, then select_active_intent."
    )]
    async fn list_intents(&self) -> CallToolResult {
        self.blocking(|g, _| match list_intents(g) {
            Ok(v) => result(v, false),
            Err(e) => unavailable(e),
        })
        .await
    }

    #[tool(
        description = "Select the intent you work under (required before changing any file). Answers the \
                       intent's <intent_context>: scope, constraints, acceptance criteria. An id you may not \
                       select is answered with an error listing those you may."
    )]
    async fn select_active_intent(&self, Parameters(a): Parameters<SelectArgs>) -> CallToolResult {
        self.blocking(move |g, _| {
            let id = a.intent_id.trim().to_string();
            match g.select(&id) {
                Ok(()) => match g.read("context") {
                    Ok(xml) => CallToolResult::success(vec![ContentBlock::text(xml)]),
                    Err(e) => unavailable(e),
                },
                Err(mut le) => {
                    if let Ok(ids) = selectable(g) {
                        le["selectable"] = json!(ids);
                    }
                    result(le, true)
                }
            }
        })
        .await
    }

    #[tool(
        description = "Your most recent refusal by intentfs (after \"Permission denied\" or \"Operation not \
                       permitted\" on a file): code, path, message, remedy, the rule that decided. Follow the \
                       remedy instead of retrying."
    )]
    async fn get_last_error(&self) -> CallToolResult {
        self.blocking(|g, _| {
            let le = g.last_error();
            if le.get("code").is_none() {
                return result(
                    json!({ "code": null, "message": "no refusal so far in this session" }),
                    false,
                );
            }
            result(le, false)
        })
        .await
    }

    #[tool(
        description = "The mount's status: workspace, policy, the agents' identities and their intents, \
                       approvals waiting for a human, counters."
    )]
    async fn get_status(&self) -> CallToolResult {
        self.blocking(|g, _| {
            let st = match g.status() {
                Ok(s) => s,
                Err(e) => return unavailable(e),
            };
            let you = g.session().map(|(k, _, _)| k).unwrap_or_default();
            result(json!({ "you": you, "status": st }), false)
        })
        .await
    }

    #[tool(
        description = "Would intentfs let you do this now? Answers decision allow / ask (a human would be \
                       asked) / deny, with the rule, and for ask and deny the code, message and remedy. \
                       Nothing is changed or recorded: ask before editing a file you are unsure about."
    )]
    async fn check_path(&self, Parameters(a): Parameters<CheckArgs>) -> CallToolResult {
        self.blocking(move |g, cwd| {
            let rel = match g.rel(Path::new(&a.path), cwd) {
                Ok(r) => r,
                Err(e) => {
                    return result(
                        error(
                            "OUTSIDE_MOUNT",
                            format!("{e:#}"),
                            "Give a path inside the workspace (relative to its root).",
                        ),
                        true,
                    )
                }
            };
            let req =
                json!({ "path": rel, "operation": a.operation.as_deref().unwrap_or("write") });
            match g.query("check", &req) {
                Ok(Ok(v)) => {
                    let invalid = v["decision"] == "invalid";
                    result(v, invalid)
                }
                Ok(Err(r)) => result(
                    error(
                        "CHECK_FAILED",
                        format!("the daemon refused the query: {}", errno_text(r.errno)),
                        "Tell the human; the intentfs mount may be outdated.",
                    ),
                    true,
                ),
                Err(e) => unavailable(e),
            }
        })
        .await
    }

    #[tool(
        description = "Ask the human ahead for an operation intentfs would stop and ask about (a change \
                       outside your intent's scope, reading a sensitive file, a delete the policy guards), \
                       giving your reason. Waits until the human decides (or the policy's timeout): approved \
                       answers the grant (once: your next operation on the path; file; expand_scope); \
                       rejected or timed out answers an error with the remedy. A human cannot approve \
                       protected paths; one request waits at a time."
    )]
    async fn request_approval(&self, Parameters(a): Parameters<ApprovalArgs>) -> CallToolResult {
        self.blocking(move |g, cwd| {
            let rel = match g.rel(Path::new(&a.path), cwd) {
                Ok(r) => r,
                Err(e) => {
                    return result(
                        error(
                            "OUTSIDE_MOUNT",
                            format!("{e:#}"),
                            "Give a path inside the workspace (relative to its root).",
                        ),
                        true,
                    )
                }
            };
            let req = json!({
                "path": rel,
                "operation": a.operation.as_deref().unwrap_or("write"),
                "reason": a.reason,
            });
            match g.query("approval", &req) {
                Ok(Ok(v)) => {
                    let ok = matches!(v["status"].as_str(), Some("approved" | "not_needed"));
                    result(v, !ok)
                }
                Ok(Err(r)) => {
                    let mut le = r.last_error;
                    if le.get("code").is_none() {
                        le = error(
                            "APPROVAL_FAILED",
                            format!("the request failed: {}", errno_text(r.errno)),
                            "Tell the human.",
                        );
                    }
                    le["status"] = json!(match le["code"].as_str() {
                        Some("APPROVAL_TIMEOUT") => "timed_out",
                        Some("APPROVAL_REJECTED") => "rejected",
                        _ => "refused",
                    });
                    result(le, true)
                }
                Err(e) => unavailable(e),
            }
        })
        .await
    }

    #[tool(
        description = "Lessons recorded from failed verifications in this workspace (tests and builds that \
                       failed before, with their output): read them before repeating the same mistake."
    )]
    async fn get_lessons(&self) -> CallToolResult {
        self.blocking(|g, _| {
            let file = match g.status() {
                Ok(s) => s["mount"]["lessons_file"]
                    .as_str()
                    .unwrap_or(crate::fs::LESSON_FILE)
                    .to_string(),
                Err(e) => return unavailable(e),
            };
            // Read as the agent, through the mount: what the agent may read, nothing else.
            match std::fs::read_to_string(g.root.join(&file)) {
                Ok(t) => CallToolResult::success(vec![ContentBlock::text(t)]),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => result(
                    json!({ "lessons_file": file, "lessons": null,
                            "message": "no lessons recorded yet" }),
                    false,
                ),
                Err(e) => result(
                    error(
                        "LESSONS_UNREADABLE",
                        format!("cannot read {file}: {e}"),
                        "Call get_last_error: reading it may have been refused.",
                    ),
                    true,
                ),
            }
        })
        .await
    }
}

/// What the server tells the model about itself (MCP `instructions`).
const INSTRUCTIONS: &str = "This workspace is governed by intentfs: every file change is checked against the \
intent (task) you selected and recorded. Before changing files call list_intents, then select_active_intent \
and follow the <intent_context> it answers. When an operation fails with \"Permission denied\" or \"Operation \
not permitted\", call get_last_error and follow its remedy instead of retrying. Unsure whether a path is in \
scope: check_path. Really need something outside it: request_approval with your reason.";

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .build(),
        )
        .with_server_info(Implementation::new("intentfs", env!("CARGO_PKG_VERSION")))
        .with_instructions(INSTRUCTIONS)
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let g = self.g.clone();
        let intents = tokio::task::spawn_blocking(move || g.intents())
            .await
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?
            .map_err(|e| ErrorData::internal_error(format!("{e:#}"), None))?;
        let mut items: Vec<Resource> = intents
            .into_iter()
            .map(|(id, name, globs)| {
                Resource::new(format!("intentfs://intents/{id}"), format!("{id}: {name}"))
                    .with_description(format!("intent {id}, owned_scope {}", globs.join(" ")))
                    .with_mime_type("application/xml")
            })
            .collect();
        items.push(
            Resource::new(
                "intentfs://context",
                "the selected intent's <intent_context>",
            )
            .with_mime_type("application/xml"),
        );
        items.push(
            Resource::new("intentfs://last_error", "your most recent refusal")
                .with_mime_type("application/json"),
        );
        Ok(ListResourcesResult::with_all_items(items))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let g = self.g.clone();
        let uri = request.uri.clone();
        let text = tokio::task::spawn_blocking(move || read_resource(&g, &uri))
            .await
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))??;
        Ok(ReadResourceResult::new(vec![ResourceContents::text(text, request.uri)]).into())
    }
}

/// A resource's text: an intent as an `<intent_context>` block (the full one, constraints
/// and criteria included, for the selected intent; id, name and scope for the others).
fn read_resource(g: &Governed, uri: &str) -> Result<String, ErrorData> {
    let internal = |e: anyhow::Error| ErrorData::internal_error(format!("{e:#}"), None);
    match uri {
        "intentfs://context" => return g.read("context").map_err(internal),
        "intentfs://last_error" => return g.read("last_error").map_err(internal),
        _ => {}
    }
    let Some(id) = uri.strip_prefix("intentfs://intents/") else {
        return Err(ErrorData::resource_not_found(
            format!("no resource {uri}"),
            None,
        ));
    };
    let selected = g.read("intent").map_err(internal)?;
    if selected.trim() == id {
        return g.read("context").map_err(internal);
    }
    let intents = g.intents().map_err(internal)?;
    let Some((id, name, globs)) = intents.into_iter().find(|(i, _, _)| i == id) else {
        return Err(ErrorData::resource_not_found(
            format!("no selectable intent {id}"),
            Some(json!({ "remedy": "list_intents gives the ids" })),
        ));
    };
    let esc = |s: &str| {
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
    };
    let mut out = format!(
        "<intent_context>\n  <id>{}</id>\n  <name>{}</name>\n  <owned_scope>\n",
        esc(&id),
        esc(&name)
    );
    for gl in &globs {
        out.push_str(&format!("    <glob>{}</glob>\n", esc(gl)));
    }
    out.push_str(
        "  </owned_scope>\n  <note>select this intent (select_active_intent) to read its constraints and \
         acceptance criteria</note>\n</intent_context>\n",
    );
    Ok(out)
}

pub fn run(a: McpArgs) -> anyhow::Result<ExitCode> {
    let cwd = match a.dir {
        Some(d) => d,
        None => std::env::current_dir().context("the current directory")?,
    };
    let g = Governed::find(&cwd)?;
    let server = Server::new(g, cwd);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let service = server
            .serve(rmcp::transport::stdio())
            .await
            .context("MCP initialization over stdio failed")?;
        service.waiting().await.context("MCP session")?;
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}
