//! A registry tool without a `command`: its contract's OCI image runs its Entrypoint
//! (scripts/test-images.sh's Python image, whose /app/tool.py echoes its JSON input),
//! through `airlock tool call`, the image leased for the call.

mod common;

use common::images::python_image;
use serde_json::{json, Value};
use std::process::Command;

#[test]
fn a_tool_without_a_command_runs_its_images_entrypoint() {
    require_cells!();
    let (state, layouts, dir) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let reference = python_image(state.path(), layouts.path());
    std::fs::write(
        dir.path().join("image.yaml"),
        format!("image: {reference}\n"),
    )
    .unwrap();
    let config = dir.path().join("airlock.toml");
    std::fs::write(
        &config,
        "[tools.image_echo]\ndescription = \"echo, from an image\"\ncontract = \"image.yaml\"\n\
         input_schema = { type = \"object\", required = [\"n\"] }\n\
         output_schema = { type = \"object\", required = [\"echo\"] }\n",
    )
    .unwrap();
    let out = Command::new(common::airlock_bin())
        .arg("tool")
        .arg("--config")
        .arg(&config)
        .arg("--state-dir")
        .arg(state.path())
        .args(["call", "image_echo", "--input", r#"{"n": 7}"#])
        .output()
        .unwrap();
    let reply: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{}", common::output_text(&out)));
    assert_eq!(reply["ok"], true, "{reply} {}", common::output_text(&out));
    assert_eq!(reply["output"]["echo"], json!({"n": 7}));
    assert_eq!(reply["output"]["uid"], 1000, "the image's user: {reply}");
}
