use super::*;
use serde::Serialize;
use std::collections::BTreeMap;

fn sample_host_messages() -> Vec<HostToAgent> {
    let env: BTreeMap<String, String> = [("A".to_string(), "1".to_string())].into();
    vec![
        HostToAgent::Hello { version: 1 },
        HostToAgent::CreateNode(NodeSpec {
            name: "n1".into(),
            rootfs: "/nodes/n1".into(),
            hostname: None,
            nic: Some("eth0".into()),
            address: Some("192.0.2.1/24".into()),
            env: env.clone(),
            command: vec!["sh".into(), "-c".into(), "echo hi".into()],
            disk: None,
        }),
        HostToAgent::StartWorkload {
            node: Some("n1".into()),
            command: vec!["true".into()],
            env,
        },
        HostToAgent::Pause { node: "n1".into() },
        HostToAgent::Resume { node: "n1".into() },
        HostToAgent::Kill {
            node: "n1".into(),
            signal: 9,
        },
        HostToAgent::Restart { node: "n1".into() },
        HostToAgent::StepClock {
            node: "n1".into(),
            by_ns: -2_000_000_000,
        },
        HostToAgent::DriftClock {
            node: "n1".into(),
            ppm: 200,
        },
        HostToAgent::Shutdown,
        HostToAgent::OpenShell {
            node: Some("n1".into()),
            rows: 24,
            cols: 80,
            term: Some("xterm".into()),
        },
        HostToAgent::ShellInput {
            data: b"ls\r\x04".to_vec(),
        },
        HostToAgent::Random {
            id: 3,
            value: u64::MAX,
        },
        HostToAgent::ListTemplate {
            node: "n1".into(),
            template: "t".into(),
        },
        HostToAgent::StartCommand {
            id: 3,
            node: "n1".into(),
            template: "t".into(),
            command: "parallel_driver_a.sh".into(),
            env: BTreeMap::new(),
        },
        HostToAgent::KillCommand { id: 3 },
        HostToAgent::Exec(sample_exec()),
        HostToAgent::ReadFile {
            id: 5,
            node: None,
            path: "/etc/hostname".into(),
            limit: 1 << 20,
        },
        HostToAgent::Processes {
            id: 6,
            node: Some("n2".into()),
        },
    ]
}

fn sample_exec() -> ExecSpec {
    ExecSpec {
        id: 4,
        node: Some("n1".into()),
        command: vec!["cat".into(), "/etc/hostname".into()],
        env: [("LANG".to_string(), "C".to_string())].into(),
        freeze: true,
        timeout_ns: 5_000_000_000,
        output_limit: 4096,
    }
}

fn sample_agent_messages() -> Vec<AgentToHost> {
    vec![
        AgentToHost::Booted { version: 1 },
        AgentToHost::Ready { version: 1 },
        AgentToHost::NodeStarted {
            name: "n1".into(),
            pid: 42,
        },
        AgentToHost::WorkloadStarted { node: None, pid: 7 },
        AgentToHost::Output {
            node: Some("n1".into()),
            stream: Stream::Stderr,
            data: (0..=255).collect(),
        },
        AgentToHost::Exited {
            node: "n1".into(),
            status: ExitStatus::Signal(9),
        },
        AgentToHost::WorkloadExited {
            status: ExitStatus::Code(3),
        },
        AgentToHost::Paused { node: "n1".into() },
        AgentToHost::Resumed { node: "n1".into() },
        AgentToHost::ClockSet {
            node: "n1".into(),
            offset_ns: 30_000_000_000,
            rate_ppm: -50,
        },
        AgentToHost::ShellOpened { pid: 9 },
        AgentToHost::ShellOutput {
            data: b"# \x1b[0m".to_vec(),
        },
        AgentToHost::ShellExited {
            status: ExitStatus::Code(0),
        },
        AgentToHost::Error {
            context: ErrorContext::Kill { node: "n9".into() },
            message: "no such node".into(),
        },
        AgentToHost::Sdk {
            node: Some("n1".into()),
            json: r#"{"antithesis_setup":{"status":"complete","details":null}}"#.into(),
        },
        AgentToHost::History {
            node: None,
            json: r#"{"detvisor_history":{"process":1}}"#.into(),
        },
        AgentToHost::RandomRequest {
            node: Some("n2".into()),
            id: 7,
        },
        AgentToHost::TemplateCommands {
            template: "t".into(),
            commands: vec!["first_a".into(), "parallel_driver_b".into()],
        },
        AgentToHost::CommandStarted { id: 3, pid: 77 },
        AgentToHost::CommandOutput {
            id: 3,
            stream: Stream::Stdout,
            data: b"x\n".to_vec(),
        },
        AgentToHost::CommandExited {
            id: 3,
            status: ExitStatus::Code(1),
        },
        AgentToHost::ExecOutput {
            id: 4,
            stream: Stream::Stderr,
            data: b"cat: x: No such file\n".to_vec(),
        },
        AgentToHost::ExecExited {
            id: 4,
            status: ExitStatus::Signal(9),
            stdout_bytes: 1 << 40,
            stderr_bytes: 0,
            timed_out: true,
        },
        AgentToHost::FileChunk {
            id: 5,
            data: vec![0, 255, 10],
        },
        AgentToHost::FileRead { id: 5, size: 3 },
        AgentToHost::ProcessRows {
            id: 6,
            rows: vec![ProcessRow {
                pid: 1,
                ppid: 0,
                state: 'T',
                name: "sh".into(),
                command: vec!["sh".into(), "-c".into(), "sleep 1".into()],
            }],
        },
        AgentToHost::ProcessesListed { id: 6, count: 1 },
    ]
}

fn stream_of<T: Serialize>(messages: &[T]) -> Vec<u8> {
    messages
        .iter()
        .flat_map(|m| encode_frame(m).unwrap())
        .collect()
}

#[test]
fn test_frame_has_le_length_prefix_and_tagged_json() {
    // Act
    let frame = encode_frame(&HostToAgent::Hello { version: 1 }).unwrap();

    // Assert
    let json = br#"{"type":"hello","version":1}"#;
    assert_eq!(frame[..4], (json.len() as u32).to_le_bytes());
    assert_eq!(&frame[4..], json);
}

#[test]
fn test_wire_format_examples() {
    // Arrange
    let output = AgentToHost::Output {
        node: None,
        stream: Stream::Stdout,
        data: b"hi\n".to_vec(),
    };
    let exited = AgentToHost::Exited {
        node: "n1".into(),
        status: ExitStatus::Code(0),
    };

    // Act
    let output_json = serde_json::to_string(&output).unwrap();
    let exited_json = serde_json::to_string(&exited).unwrap();
    let create: HostToAgent = serde_json::from_str(
        r#"{"type":"create_node","name":"n1","rootfs":"/n1","command":["sh"]}"#,
    )
    .unwrap();

    // Assert
    assert_eq!(
        output_json,
        r#"{"type":"output","node":null,"stream":"stdout","data":"aGkK"}"#
    );
    assert_eq!(
        exited_json,
        r#"{"type":"exited","node":"n1","status":{"code":0}}"#
    );
    assert_eq!(
        create,
        HostToAgent::CreateNode(NodeSpec {
            name: "n1".into(),
            rootfs: "/n1".into(),
            hostname: None,
            nic: None,
            address: None,
            env: BTreeMap::new(),
            command: vec!["sh".into()],
            disk: None,
        })
    );
}

#[test]
fn test_every_message_round_trips() {
    // Arrange
    let host = sample_host_messages();
    let agent = sample_agent_messages();
    let mut host_decoder = FrameDecoder::default();
    let mut agent_decoder = FrameDecoder::default();

    // Act
    host_decoder.push(&stream_of(&host));
    agent_decoder.push(&stream_of(&agent));
    let host_back: Vec<HostToAgent> =
        std::iter::from_fn(|| host_decoder.next_message().unwrap()).collect();
    let agent_back: Vec<AgentToHost> =
        std::iter::from_fn(|| agent_decoder.next_message().unwrap()).collect();

    // Assert
    assert_eq!(host_back, host);
    assert_eq!(agent_back, agent);
    assert_eq!(host_decoder.buffered_len(), 0);
}

#[test]
fn test_decoding_split_at_every_byte_gives_the_same_messages() {
    // Arrange
    let messages = sample_agent_messages();
    let stream = stream_of(&messages);

    for split in 0..=stream.len() {
        // Act: two pieces, split at `split`.
        let mut decoder = FrameDecoder::default();
        let mut decoded: Vec<AgentToHost> = Vec::new();
        for piece in [&stream[..split], &stream[split..]] {
            decoder.push(piece);
            while let Some(message) = decoder.next_message().unwrap() {
                decoded.push(message);
            }
        }

        // Assert
        assert_eq!(decoded, messages, "split at {split}");
        assert_eq!(decoder.buffered_len(), 0);
    }
}

#[test]
fn test_decoding_one_byte_at_a_time() {
    // Arrange
    let messages = sample_host_messages();
    let stream = stream_of(&messages);
    let mut decoder = FrameDecoder::default();
    let mut decoded: Vec<HostToAgent> = Vec::new();

    // Act
    for byte in &stream {
        decoder.push(std::slice::from_ref(byte));
        while let Some(message) = decoder.next_message().unwrap() {
            decoded.push(message);
        }
    }

    // Assert
    assert_eq!(decoded, messages);
}

#[test]
fn test_partial_frame_waits_for_more_bytes() {
    // Arrange
    let frame = encode_frame(&HostToAgent::Shutdown).unwrap();
    let mut decoder = FrameDecoder::default();

    // Act
    decoder.push(&frame[..3]);
    let no_header = decoder.next_frame();
    decoder.push(&frame[3..frame.len() - 1]);
    let no_body = decoder.next_frame();
    decoder.push(&frame[frame.len() - 1..]);
    let message: Option<HostToAgent> = decoder.next_message().unwrap();

    // Assert
    assert_eq!(no_header, Ok(None));
    assert_eq!(no_body, Ok(None));
    assert_eq!(message, Some(HostToAgent::Shutdown));
}

#[test]
fn test_oversized_length_is_rejected_at_the_header_and_poisons() {
    // Arrange
    let mut decoder = FrameDecoder::new(1000);
    let mut stream = 1001u32.to_le_bytes().to_vec();
    stream.extend_from_slice(&encode_frame(&HostToAgent::Shutdown).unwrap());

    // Act
    decoder.push(&stream[..4]);
    let first = decoder.next_frame();
    decoder.push(&stream[4..]);
    let second = decoder.next_message::<HostToAgent>();

    // Assert
    let expected = FrameError::TooLarge {
        len: 1001,
        max: 1000,
    };
    assert_eq!(first, Err(expected.clone()));
    assert!(expected.is_fatal());
    assert_eq!(second, Err(expected));
    assert!(decoder.is_poisoned());
    assert_eq!(decoder.buffered_len(), 0);
}

#[test]
fn test_malformed_frame_is_dropped_and_the_next_one_decodes() {
    // Arrange
    let mut stream = Vec::new();
    for bad in [
        &b"not json"[..],
        br#"{"type":"no_such_message"}"#,
        br#"{"type":"kill","node":"n1"}"#,
        br#"{"type":"hello","version":1} trailing"#,
        b"",
    ] {
        stream.extend_from_slice(&frame_payload(bad).unwrap());
    }
    stream.extend_from_slice(&encode_frame(&HostToAgent::Shutdown).unwrap());
    let mut decoder = FrameDecoder::default();
    decoder.push(&stream);

    // Act
    let results: Vec<_> = (0..6)
        .map(|_| decoder.next_message::<HostToAgent>())
        .collect();

    // Assert
    for result in &results[..5] {
        match result {
            Err(error @ FrameError::Malformed { .. }) => assert!(!error.is_fatal()),
            other => panic!("expected a malformed-frame error, got {other:?}"),
        }
    }
    assert_eq!(results[5], Ok(Some(HostToAgent::Shutdown)));
}

#[test]
fn test_garbage_input_never_panics_and_ends_in_errors() {
    // Arrange: a fixed pseudo-random byte stream (xorshift).
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let garbage: Vec<u8> = (0..64 << 10)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    for max in [16, 4096, MAX_FRAME_LEN] {
        let mut decoder = FrameDecoder::new(max);
        let mut errors = 0;

        // Act
        for piece in garbage.chunks(997) {
            decoder.push(piece);
            loop {
                match decoder.next_message::<HostToAgent>() {
                    Ok(Some(message)) => panic!("garbage decoded as {message:?}"),
                    Ok(None) => break,
                    Err(error) => {
                        errors += 1;
                        if error.is_fatal() {
                            break;
                        }
                    }
                }
            }
            if decoder.is_poisoned() {
                break;
            }
        }

        // Assert
        assert!(errors > 0, "max {max}");
        assert!(decoder.buffered_len() <= max + LEN_PREFIX);
    }
}

#[test]
fn test_encoder_refuses_oversized_payload() {
    // Arrange
    let big = AgentToHost::Output {
        node: None,
        stream: Stream::Stdout,
        data: vec![0; MAX_FRAME_LEN],
    };

    // Act
    let result = encode_frame(&big);

    // Assert
    assert!(matches!(result, Err(FrameError::Encode(_))));
}

#[test]
fn test_max_output_chunk_fits_in_a_frame() {
    // Arrange
    let chunk = AgentToHost::Output {
        node: Some("x".repeat(255)),
        stream: Stream::Stderr,
        data: vec![0xff; MAX_OUTPUT_CHUNK],
    };

    // Act
    let frame = encode_frame(&chunk).unwrap();

    // Assert
    assert!(frame.len() < MAX_FRAME_LEN);
}

#[test]
fn test_exit_status_shell_code() {
    assert_eq!(ExitStatus::Code(3).shell_code(), 3);
    assert_eq!(ExitStatus::Signal(9).shell_code(), 137);
}

#[test]
fn test_an_error_message_keeps_its_json_fields() {
    let error = AgentToHost::Error {
        context: ErrorContext::CreateNode { node: "n2".into() },
        message: "no such directory".into(),
    };
    let json = r#"{"type":"error","context":"create_node n2","message":"no such directory"}"#;
    assert_eq!(serde_json::to_string(&error).unwrap(), json);
    assert_eq!(serde_json::from_str::<AgentToHost>(json).unwrap(), error);
}

#[test]
fn test_texts_that_name_no_context_are_refused() {
    for bad in [
        "",
        "hello n1",
        "create_node",
        "random x",
        "random",
        "kill_command -1",
        "channel 2",
        "no_such_request n1",
    ] {
        assert_eq!(
            bad.parse::<ErrorContext>(),
            Err(UnknownErrorContext(bad.into())),
            "{bad:?}"
        );
    }
    let frame = r#"{"type":"error","context":"hello n1","message":"m"}"#;
    assert!(serde_json::from_str::<AgentToHost>(frame).is_err());
}

#[test]
fn test_a_request_names_its_own_context() {
    let create: HostToAgent = serde_json::from_str(
        r#"{"type":"create_node","name":"n3","rootfs":"/n3","command":["sh"]}"#,
    )
    .unwrap();
    assert_eq!(create.error_context().to_string(), "create_node n3");
    let kill = HostToAgent::Kill {
        node: "n1".into(),
        signal: 9,
    };
    assert_eq!(
        kill.error_context(),
        ErrorContext::Kill { node: "n1".into() }
    );
    let command = HostToAgent::StartCommand {
        id: 4,
        node: "n1".into(),
        template: "t".into(),
        command: "first_x".into(),
        env: BTreeMap::new(),
    };
    assert_eq!(command.error_context().to_string(), "start_command first_x");
    assert_eq!(
        HostToAgent::Random { id: 7, value: 1 }.error_context(),
        ErrorContext::Random { id: 7 }
    );
}

/// The inspection requests' wire form, and what their answers name.
#[test]
fn test_inspection_messages_have_their_wire_form_and_contexts() {
    let exec = HostToAgent::Exec(sample_exec());
    assert_eq!(
        serde_json::to_string(&exec).unwrap(),
        r#"{"type":"exec","id":4,"node":"n1","command":["cat","/etc/hostname"],"env":{"LANG":"C"},"freeze":true,"timeout_ns":5000000000,"output_limit":4096}"#
    );
    assert_eq!(exec.error_context().to_string(), "exec 4");
    let read: HostToAgent =
        serde_json::from_str(r#"{"type":"read_file","id":9,"path":"/etc/os-release","limit":10}"#)
            .unwrap();
    assert_eq!(read.error_context(), ErrorContext::ReadFile { id: 9 });
    let listed: AgentToHost = serde_json::from_str(
        r#"{"type":"process_rows","id":2,"rows":[{"pid":1,"ppid":0,"state":"S","name":"sh","command":["sh"]}]}"#,
    )
    .unwrap();
    assert!(matches!(listed, AgentToHost::ProcessRows { rows, .. } if rows[0].state == 'S'));
    let output = AgentToHost::ExecOutput {
        id: 1,
        stream: Stream::Stdout,
        data: b"hi".to_vec(),
    };
    assert_eq!(
        serde_json::to_string(&output).unwrap(),
        r#"{"type":"exec_output","id":1,"stream":"stdout","data":"aGk="}"#
    );
}

/// Bad inspection input is refused with a message naming the problem.
#[test]
fn test_bad_inspection_requests_are_refused() {
    let mut empty = sample_exec();
    empty.command.clear();
    assert_eq!(empty.check().unwrap_err(), "exec: empty command");
    let mut blank = sample_exec();
    blank.command = vec![String::new()];
    assert_eq!(blank.check().unwrap_err(), "exec: empty command");
    let mut no_time = sample_exec();
    no_time.timeout_ns = 0;
    assert_eq!(no_time.check().unwrap_err(), "exec: a timeout of 0 ns");
    assert_eq!(sample_exec().check(), Ok(()));
    // Missing fields and a state that is no single letter do not decode.
    for bad in [
        r#"{"type":"exec","id":1,"command":["ls"]}"#,
        r#"{"type":"read_file","id":1,"path":"/x"}"#,
        r#"{"type":"processes"}"#,
    ] {
        assert!(serde_json::from_str::<HostToAgent>(bad).is_err(), "{bad}");
    }
    let two_letters = r#"{"type":"process_rows","id":2,"rows":[{"pid":1,"ppid":0,"state":"SS","name":"sh","command":[]}]}"#;
    assert!(serde_json::from_str::<AgentToHost>(two_letters).is_err());
}

/// The most a `process_rows` message can hold fits in one frame.
#[test]
fn test_a_full_batch_of_process_rows_fits_in_a_frame() {
    let row = ProcessRow {
        pid: i32::MAX,
        ppid: i32::MAX,
        state: 'R',
        name: "\u{1}".repeat(15),
        command: vec!["\u{1}".repeat(MAX_PROCESS_COMMAND / 16); 16],
    };
    let message = AgentToHost::ProcessRows {
        id: u64::MAX,
        rows: vec![row; PROCESS_ROWS_PER_MESSAGE],
    };
    assert!(encode_frame(&message).is_ok());
}
