//! `dlock doctor`: checks the deployment behind the URL for settings that break locks.

use clap::Args;

#[derive(Args, Debug)]
pub struct DoctorArgs {}

/// Exit code when a finding is unsafe.
const EXIT_UNSAFE: u8 = 1;

pub async fn doctor(url: &str, _args: DoctorArgs) -> u8 {
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
    println!("{} at {}", client.backend_kind(), client.endpoint());
    let mut unsafe_found = false;
    for f in &findings {
        let label = match f.severity {
            distlock::Severity::Ok => "OK",
            distlock::Severity::Warning => "WARN",
            _ => {
                unsafe_found = true;
                "UNSAFE"
            }
        };
        println!("{label:<6} {}: {}", f.check, f.message);
    }
    if unsafe_found {
        EXIT_UNSAFE
    } else {
        0
    }
}
