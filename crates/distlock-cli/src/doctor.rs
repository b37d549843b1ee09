//! `dlock doctor [--json]`: checks the deployment behind the URL for settings that break
//! locks.

use clap::Args;

#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// Print one JSON object on stdout: backend, endpoint, unsafe (true when any finding
    /// is), findings [{check, severity (ok, warning or unsafe), message}].
    #[arg(long)]
    json: bool,
}

/// Exit code when a finding is unsafe.
const EXIT_UNSAFE: u8 = 1;

pub async fn doctor(url: &str, args: DoctorArgs) -> u8 {
    let client = match crate::connect(url, distlock::ClientOptions::default()).await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let findings = match client.diagnose().await {
        Ok(f) => f,
        Err(e) => {
            eprintln!("dlock: {e}");
            return crate::EXIT_ERROR;
        }
    };
    let severity = |f: &distlock::Finding| match f.severity {
        distlock::Severity::Ok => "ok",
        distlock::Severity::Warning => "warning",
        // Anything else (a severity added later) counts as unsafe.
        _ => "unsafe",
    };
    let unsafe_found = findings.iter().any(|f| severity(f) == "unsafe");
    if args.json {
        let findings: Vec<_> = findings
            .iter()
            .map(|f| {
                serde_json::json!({
                    "check": f.check,
                    "severity": severity(f),
                    "message": f.message,
                })
            })
            .collect();
        let v = serde_json::json!({
            "backend": client.backend_kind(),
            "endpoint": client.endpoint(),
            "unsafe": unsafe_found,
            "findings": findings,
        });
        println!("{v}");
    } else {
        println!("{} at {}", client.backend_kind(), client.endpoint());
        for f in &findings {
            let label = match severity(f) {
                "ok" => "OK",
                "warning" => "WARN",
                _ => "UNSAFE",
            };
            println!("{label:<6} {}: {}", f.check, f.message);
        }
    }
    if unsafe_found {
        EXIT_UNSAFE
    } else {
        0
    }
}
