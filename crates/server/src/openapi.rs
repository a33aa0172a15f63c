//! The OpenAPI 3.1 document of the `/v1` API, generated from the handlers' and bodies'
//! types (docs/openapi.json; a test fails when the committed one is stale).

use crate::{api, approvals, error, health, runs, sessions, verification};
use utoipa::OpenApi;

#[derive(OpenApi)]
#[openapi(
    info(title = "airlock", description = "The execution service: runs, sessions, files, records (docs/api.md)"),
    paths(
        runs::create_run, runs::create_streamed_run, runs::get_run, runs::list_runs, runs::verify,
        sessions::create_session, sessions::list_sessions, sessions::get_session,
        sessions::exec, sessions::get_command, sessions::command_output, sessions::signal,
        sessions::set_timeout, sessions::delete_session, sessions::put_file,
        sessions::get_file, sessions::list_files, sessions::change_network,
        health::healthz, health::readyz, health::metrics,
        approvals::list_approvals, approvals::decide_approval,
        verification::acknowledge,
    ),
    components(schemas(
        error::ErrorBody, api::RunBody, api::RunView, api::RunList, api::SessionBody,
        api::SessionView, api::SessionList, api::ExecBody, api::CommandView, api::SignalBody,
        api::TimeoutBody, api::NetworkBody, api::NetworkView, api::DirEntry, api::DirList, api::Written, api::Verified, api::Health,
        approvals::Decision, approvals::DecisionKind, approvals::ApprovalList,
        approvals::PendingApproval, verification::ClassVerification,
    )),
    modifiers(&BearerAuth),
    security(("bearer" = []))
)]
pub struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The document as committed: pretty JSON with a final newline.
pub fn document() -> String {
    let mut doc = ApiDoc::openapi();
    // The crate's version would make every release rewrite the file.
    doc.info.version = "1".into();
    doc.to_pretty_json().unwrap_or_default() + "\n"
}

#[cfg(test)]
mod tests {
    fn committed() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.json")
    }

    /// `AIRLOCK_BLESS=1 cargo test -p airlock-server openapi` rewrites docs/openapi.json.
    #[test]
    fn the_committed_openapi_document_matches_the_types() {
        let expected = super::document();
        if std::env::var_os("AIRLOCK_BLESS").is_some_and(|v| v == "1") {
            std::fs::write(committed(), &expected).unwrap();
            return;
        }
        let actual = std::fs::read_to_string(committed()).unwrap_or_default();
        assert!(
            actual == expected,
            "docs/openapi.json is out of date; regenerate it with \
             `AIRLOCK_BLESS=1 cargo test -p airlock-server openapi`"
        );
    }

    #[test]
    fn the_document_is_openapi_3_1_and_has_every_route() {
        let doc: serde_json::Value = serde_json::from_str(&super::document()).unwrap();
        assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"));
        for path in [
            "/v1/runs",
            "/v1/runs/{id}",
            "/v1/sessions/{id}/exec",
            "/v1/sessions/{id}/network",
            "/v1/audit/verify",
            "/v1/approvals",
            "/v1/approvals/{id}",
            "/metrics",
        ] {
            assert!(doc["paths"][path].is_object(), "{path} missing");
        }
    }
}
