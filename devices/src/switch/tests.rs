//! The switch's tests; the link-level faults' are in `tests/faults.rs`.

use super::*;

/// The link-level faults (cuts, one-way partitions, topologies, slow
/// and lossy nodes) and frame recording.
mod faults;

const KEY: [u8; 32] = *b"detvisor network switch test key";
const OTHER_KEY: [u8; 32] = *b"detvisor network switch other ke";
const A: PortId = PortId(2);
const B: PortId = PortId(3);
const C: PortId = PortId(4);
const MAC_A: [u8; 6] = [0x52, 0x54, 0, 0, 0, 0xa];
const MAC_B: [u8; 6] = [0x52, 0x54, 0, 0, 0, 0xb];
const MAC_C: [u8; 6] = [0x52, 0x54, 0, 0, 0, 0xc];
const MICROS_100: VirtNanos = VirtNanos::from_micros(100);

fn mac_of(port: PortId) -> [u8; 6] {
    match port {
        A => MAC_A,
        B => MAC_B,
        _ => MAC_C,
    }
}

fn frame(to: [u8; 6], from: PortId, tag: u32) -> Vec<u8> {
    let mut frame = to.to_vec();
    frame.extend_from_slice(&mac_of(from));
    frame.extend_from_slice(&[0x08, 0x00]);
    frame.extend_from_slice(&tag.to_le_bytes());
    frame
}

fn tag(frame: &[u8]) -> u32 {
    u32::from_le_bytes(frame[14..18].try_into().unwrap())
}

fn switch_with(key: [u8; 32], config: NetworkConfig) -> Switch {
    let mut switch = Switch::new(key, config).unwrap();
    for port in [A, B, C] {
        switch.add_port(port, mac_of(port));
    }
    switch
}

fn fixed(latency: VirtNanos) -> NetworkConfig {
    NetworkConfig::reliable(LatencyDist::Fixed(latency))
}

/// Reliable, with a latency uniform over 1 µs..=1 ms.
fn jittery() -> NetworkConfig {
    NetworkConfig::reliable(LatencyDist::Uniform {
        min: VirtNanos::from_micros(1),
        max: VirtNanos::from_micros(1_000),
    })
}

fn lossy() -> NetworkConfig {
    NetworkConfig {
        latency: LatencyDist::Uniform {
            min: VirtNanos::from_micros(50),
            max: VirtNanos::from_micros(500),
        },
        loss: 0.2,
        duplicate: 0.1,
        reorder: 0.2,
        reorder_delay: LatencyDist::Normal {
            min: VirtNanos::ZERO,
            max: VirtNanos::from_micros(300),
            terms: 4,
        },
    }
}

/// Every delivery as (time, destination, tag), collecting at each
/// deadline the switch reports.
fn drain(switch: &mut Switch) -> Vec<(VirtNanos, PortId, u32)> {
    let mut schedule = Vec::new();
    while let Some(deadline) = switch.next_deadline() {
        let due = switch.due(deadline);
        assert!(!due.is_empty(), "nothing arrived at deadline {deadline}");
        schedule.extend(due.into_iter().map(|(to, f)| (deadline, to, tag(&f))));
    }
    schedule
}

/// 200 frames between A, B and C, 10 µs apart, then every delivery.
fn run_workload(switch: &mut Switch) -> Vec<(VirtNanos, PortId, u32)> {
    let mut schedule = Vec::new();
    for i in 0..200u32 {
        let now = VirtNanos::from_micros(10 * u64::from(i));
        schedule.extend(
            switch
                .due(now)
                .into_iter()
                .map(|(to, f)| (now, to, tag(&f))),
        );
        let (from, to) = [(A, MAC_B), (B, MAC_C), (C, MAC_A)][i as usize % 3];
        switch.submit(now, from, frame(to, from, i)).unwrap();
    }
    schedule.extend(drain(switch));
    schedule
}

#[test]
fn test_switch_same_key_gives_same_delivery_schedule() {
    // Arrange
    let mut first = switch_with(KEY, lossy());
    let mut second = switch_with(KEY, lossy());

    // Act
    let first_schedule = run_workload(&mut first);
    let second_schedule = run_workload(&mut second);

    // Assert
    assert_eq!(first_schedule, second_schedule);
    assert_eq!(first.save(), second.save());
    let counters = first.counters(A).unwrap();
    assert_eq!(counters.sent, 67);
    assert!(counters.dropped_loss > 0);
    assert!(counters.duplicated > 0);
    assert!(counters.reordered > 0);
}

#[test]
fn test_switch_other_key_gives_other_schedule() {
    // Arrange
    let mut first = switch_with(KEY, lossy());
    let mut second = switch_with(OTHER_KEY, lossy());

    // Act
    let first_schedule = run_workload(&mut first);
    let second_schedule = run_workload(&mut second);

    // Assert
    assert_ne!(first_schedule, second_schedule);
}

#[test]
fn test_switch_loss_one_drops_every_frame() {
    // Arrange
    let mut config = fixed(MICROS_100);
    config.loss = 1.0;
    let mut switch = switch_with(KEY, config);

    // Act
    for i in 0..50 {
        switch
            .submit(VirtNanos(i), A, frame(MAC_B, A, i as u32))
            .unwrap();
    }
    switch
        .submit(VirtNanos(60), B, frame(BROADCAST_MAC, B, 99))
        .unwrap();

    // Assert
    assert_eq!(switch.next_deadline(), None);
    assert!(switch.due(VirtNanos::from_secs(1)).is_empty());
    assert_eq!(switch.counters(A).unwrap().dropped_loss, 50);
    assert_eq!(switch.counters(B).unwrap().dropped_loss, 2);
    assert_eq!(switch.counters(B).unwrap().delivered, 0);
}

#[test]
fn test_switch_delivers_after_fixed_latency_and_counts() {
    // Arrange
    let mut switch = switch_with(KEY, fixed(MICROS_100));
    let sent = frame(MAC_B, A, 1);

    // Act
    switch.submit(VirtNanos(1_000), A, sent.clone()).unwrap();
    let deadline = switch.next_deadline();
    let early = switch.due(VirtNanos(100_999));
    let on_time = switch.due(VirtNanos(101_000));

    // Assert
    assert_eq!(deadline, Some(VirtNanos(101_000)));
    assert!(early.is_empty());
    assert_eq!(on_time, [(B, sent)]);
    assert_eq!(switch.counters(A).unwrap().sent, 1);
    assert_eq!(switch.counters(B).unwrap().delivered, 1);
    assert_eq!(switch.next_deadline(), None);
}

#[test]
fn test_switch_broadcast_and_multicast_go_to_every_other_port() {
    // Arrange
    let mut switch = switch_with(KEY, fixed(MICROS_100));
    let multicast = [0x01, 0x00, 0x5e, 0, 0, 1];

    // Act
    switch
        .submit(VirtNanos(0), B, frame(BROADCAST_MAC, B, 1))
        .unwrap();
    switch
        .submit(VirtNanos(0), C, frame(multicast, C, 2))
        .unwrap();
    let delivered = switch.due(MICROS_100);

    // Assert: in port order, never back to the sender.
    let delivered: Vec<(PortId, u32)> = delivered.iter().map(|(p, f)| (*p, tag(f))).collect();
    assert_eq!(delivered, [(A, 1), (C, 1), (A, 2), (B, 2)]);
}

#[test]
fn test_switch_unknown_unicast_and_runts_are_dropped() {
    // Arrange
    let mut switch = switch_with(KEY, fixed(MICROS_100));

    // Act
    switch
        .submit(VirtNanos(0), A, frame([0x52, 0x54, 0, 0, 0, 0xee], A, 1))
        .unwrap();
    switch.submit(VirtNanos(0), A, frame(MAC_A, A, 2)).unwrap();
    switch.submit(VirtNanos(0), A, MAC_B.to_vec()).unwrap();
    let unknown_sender = switch.submit(VirtNanos(0), PortId(9), frame(MAC_B, A, 3));

    // Assert
    assert_eq!(switch.in_flight_len(), 0);
    assert_eq!(switch.counters(A).unwrap().dropped_no_destination, 3);
    assert_eq!(
        unknown_sender,
        Err(SwitchError::UnknownPort { port: PortId(9) })
    );
}

#[test]
fn test_switch_simultaneous_deliveries_come_out_in_sequence_order() {
    // Arrange
    let mut switch = switch_with(KEY, fixed(MICROS_100));

    // Act: all due at 100 µs; submitted from several ports, to several.
    for (i, (from, to)) in [(C, MAC_A), (A, MAC_B), (B, MAC_A), (A, MAC_C), (C, MAC_B)]
        .into_iter()
        .enumerate()
    {
        switch
            .submit(VirtNanos(0), from, frame(to, from, i as u32))
            .unwrap();
    }
    let delivered = switch.due(VirtNanos::from_secs(1));

    // Assert
    let tags: Vec<u32> = delivered.iter().map(|(_, f)| tag(f)).collect();
    assert_eq!(tags, [0, 1, 2, 3, 4]);
    let state = switch.save();
    assert_eq!(state.next_seq, 5);
}

#[test]
fn test_switch_link_is_fifo_without_reordering_even_with_jitter() {
    // Arrange
    let mut switch = switch_with(KEY, jittery());

    // Act
    for i in 0..100u32 {
        switch
            .submit(VirtNanos::from_micros(u64::from(i)), A, frame(MAC_B, A, i))
            .unwrap();
    }
    let schedule = drain(&mut switch);

    // Assert
    let tags: Vec<u32> = schedule.iter().map(|&(_, _, t)| t).collect();
    assert_eq!(tags, (0..100).collect::<Vec<_>>());
    assert!(schedule.windows(2).all(|w| w[0].0 <= w[1].0));
}

#[test]
fn test_switch_reordered_frames_are_overtaken() {
    // Arrange
    let mut config = fixed(MICROS_100);
    config.reorder = 1.0;
    config.reorder_delay = LatencyDist::Fixed(VirtNanos::from_micros(25));
    let mut switch = switch_with(KEY, config);
    switch.submit(VirtNanos(0), A, frame(MAC_B, A, 0)).unwrap();
    switch
        .set_link_config(A, B, Some(fixed(MICROS_100)))
        .unwrap();

    // Act
    switch
        .submit(VirtNanos::from_micros(10), A, frame(MAC_B, A, 1))
        .unwrap();
    let schedule = drain(&mut switch);

    // Assert
    assert_eq!(
        schedule,
        [
            (VirtNanos::from_micros(110), B, 1),
            (VirtNanos::from_micros(125), B, 0)
        ]
    );
    assert_eq!(switch.counters(A).unwrap().reordered, 1);
}

#[test]
fn test_switch_duplicate_one_delivers_twice() {
    // Arrange
    let mut config = fixed(MICROS_100);
    config.duplicate = 1.0;
    let mut switch = switch_with(KEY, config);

    // Act
    switch.submit(VirtNanos(0), A, frame(MAC_B, A, 7)).unwrap();
    let delivered = switch.due(MICROS_100);

    // Assert
    assert_eq!(delivered.len(), 2);
    assert!(delivered.iter().all(|(to, f)| *to == B && tag(f) == 7));
    assert_eq!(switch.counters(A).unwrap().duplicated, 1);
    assert_eq!(switch.counters(B).unwrap().delivered, 2);
}

#[test]
fn test_switch_loss_does_not_shift_the_latencies_of_surviving_frames() {
    // Arrange
    let base = NetworkConfig {
        latency: LatencyDist::Uniform {
            min: VirtNanos::from_micros(1),
            max: VirtNanos::from_micros(1_000),
        },
        ..fixed(VirtNanos::ZERO)
    };
    let mut lossy = base;
    lossy.loss = 0.5;
    let mut reliable = switch_with(KEY, base);
    let mut lossy = switch_with(KEY, lossy);

    // Act: frames far apart, so no FIFO clamping.
    let (mut reliable_delays, mut lossy_delays) = (Vec::new(), Vec::new());
    for (switch, delays) in [
        (&mut reliable, &mut reliable_delays),
        (&mut lossy, &mut lossy_delays),
    ] {
        for i in 0..40u32 {
            let now = VirtNanos::from_secs(u64::from(i));
            switch.submit(now, A, frame(MAC_B, A, i)).unwrap();
            if let Some(deadline) = switch.next_deadline() {
                switch.due(deadline);
                delays.push((i, deadline - now));
            }
        }
    }

    // Assert
    assert_eq!(reliable_delays.len(), 40);
    assert!(lossy_delays.len() < 40 && !lossy_delays.is_empty());
    for survivor in &lossy_delays {
        assert!(reliable_delays.contains(survivor));
    }
}

#[test]
fn test_switch_normal_latency_stays_in_bounds_and_centres() {
    // Arrange
    let (min, max) = (VirtNanos::from_micros(100), VirtNanos::from_micros(300));
    let dist = LatencyDist::Normal { min, max, terms: 8 };
    let mut rng = ChaCha20Rng::from_seed(KEY);

    // Act
    let samples: Vec<VirtNanos> = (0..2_000).map(|_| dist.sample(&mut rng)).collect();

    // Assert
    assert!(samples.iter().all(|s| (min..=max).contains(s)));
    let middle = samples
        .iter()
        .filter(|s| (VirtNanos::from_micros(150)..=VirtNanos::from_micros(250)).contains(s))
        .count();
    assert!(middle > 1_800, "only {middle} samples in the middle half");
    assert_eq!(rng.get_word_pos(), 2_000 * 8 * 2);
}

#[test]
fn test_switch_partition_then_heal_at_exact_times() {
    // Arrange: A and B apart from 1 ms to 2 ms; C with A.
    let mut switch = switch_with(KEY, fixed(MICROS_100));
    let start = VirtNanos::from_micros(1_000);
    let end = VirtNanos::from_micros(2_000);
    switch.partition(start, vec![vec![A, C], vec![B]]).unwrap();
    switch.heal(end).unwrap();

    // Act
    // Due just before the cut: arrives.
    switch
        .submit(VirtNanos::from_micros(899), A, frame(MAC_B, A, 1))
        .unwrap();
    // Due exactly at the cut: the fault applies first.
    switch
        .submit(VirtNanos::from_micros(900), A, frame(MAC_B, A, 2))
        .unwrap();
    // In flight across the cut: lost.
    switch
        .submit(VirtNanos::from_micros(950), B, frame(MAC_A, B, 3))
        .unwrap();
    // Same side: unaffected.
    switch
        .submit(VirtNanos::from_micros(950), A, frame(MAC_C, A, 4))
        .unwrap();
    let deadline_before = switch.next_deadline();
    let mut schedule = drain(&mut switch);
    // During the partition: dropped at submit, both directions.
    switch
        .submit(VirtNanos::from_micros(1_500), A, frame(MAC_B, A, 5))
        .unwrap();
    switch
        .submit(VirtNanos::from_micros(1_999), B, frame(MAC_A, B, 6))
        .unwrap();
    switch
        .submit(VirtNanos::from_micros(1_999), C, frame(MAC_A, C, 7))
        .unwrap();
    // At the heal: delivered again.
    switch.submit(end, B, frame(MAC_A, B, 8)).unwrap();
    schedule.extend(drain(&mut switch));

    // Assert
    assert_eq!(deadline_before, Some(VirtNanos::from_micros(999)));
    assert_eq!(
        schedule,
        [
            (VirtNanos::from_micros(999), B, 1),
            (VirtNanos::from_micros(1_050), C, 4),
            (VirtNanos::from_micros(2_099), A, 7),
            (VirtNanos::from_micros(2_100), A, 8),
        ]
    );
    assert_eq!(switch.counters(A).unwrap().dropped_partition, 2);
    assert_eq!(switch.counters(B).unwrap().dropped_partition, 2);
    assert_eq!(switch.blocked_links(), []);
    assert!(switch.scheduled_faults().is_empty());
}

#[test]
fn test_switch_next_deadline_skips_frames_a_scheduled_partition_cuts() {
    // Arrange
    let mut switch = switch_with(KEY, fixed(MICROS_100));
    switch.submit(VirtNanos(0), A, frame(MAC_B, A, 1)).unwrap();
    switch.submit(VirtNanos(10), A, frame(MAC_C, A, 2)).unwrap();
    switch.partition(VirtNanos(50), vec![vec![B]]).unwrap();

    // Act
    let deadline = switch.next_deadline();
    let delivered = switch.due(VirtNanos(200_000));

    // Assert
    assert_eq!(deadline, Some(VirtNanos(100_010)));
    assert_eq!(delivered.len(), 1);
    assert_eq!(delivered[0].0, C);
}

#[test]
fn test_switch_partition_unlisted_ports_form_one_group() {
    // Arrange
    let mut switch = switch_with(KEY, fixed(MICROS_100));
    switch.partition(VirtNanos(0), vec![vec![A]]).unwrap();

    // Act
    switch.submit(VirtNanos(0), B, frame(MAC_C, B, 1)).unwrap();
    switch
        .submit(VirtNanos(0), B, frame(BROADCAST_MAC, B, 2))
        .unwrap();
    let delivered: Vec<(PortId, u32)> = switch
        .due(MICROS_100)
        .iter()
        .map(|(p, f)| (*p, tag(f)))
        .collect();

    // Assert
    assert_eq!(delivered, [(C, 1), (C, 2)]);
    assert_eq!(switch.counters(B).unwrap().dropped_partition, 1);
}

#[test]
fn test_switch_fault_schedule_is_checked() {
    // Arrange
    let mut switch = switch_with(KEY, fixed(MICROS_100));
    switch.due(VirtNanos(500));

    // Act
    let past = switch.heal(VirtNanos(499));
    let twice = switch.partition(VirtNanos(600), vec![vec![A, B], vec![B]]);
    let unknown = switch.partition(VirtNanos(600), vec![vec![PortId(0)]]);
    let now = switch.heal(VirtNanos(500));

    // Assert
    assert_eq!(
        past,
        Err(SwitchError::FaultInThePast {
            at: VirtNanos(499),
            now: VirtNanos(500)
        })
    );
    assert_eq!(twice, Err(SwitchError::PortInTwoGroups { port: B }));
    assert_eq!(unknown, Err(SwitchError::UnknownPort { port: PortId(0) }));
    assert_eq!(now, Ok(()));
    assert_eq!(switch.scheduled_faults(), [(VirtNanos(500), Fault::Heal)]);
}

#[test]
fn test_switch_invalid_configs_are_refused() {
    // Arrange
    let bad = [
        NetworkConfig {
            loss: 1.5,
            ..fixed(MICROS_100)
        },
        NetworkConfig {
            duplicate: f64::NAN,
            ..fixed(MICROS_100)
        },
        NetworkConfig {
            reorder: -0.1,
            ..fixed(MICROS_100)
        },
        NetworkConfig::reliable(LatencyDist::Uniform {
            min: VirtNanos(2),
            max: VirtNanos(1),
        }),
        NetworkConfig::reliable(LatencyDist::Normal {
            min: VirtNanos(1),
            max: VirtNanos(2),
            terms: 0,
        }),
    ];

    // Act / Assert
    for config in bad {
        assert!(matches!(
            Switch::new(KEY, config),
            Err(SwitchError::InvalidConfig { .. })
        ));
    }
    let mut switch = switch_with(KEY, fixed(MICROS_100));
    assert!(switch.set_config(bad[0]).is_err());
    assert_eq!(switch.config(), &fixed(MICROS_100));
}

#[test]
fn test_switch_state_round_trip_mid_flight_delivers_identically() {
    // Arrange: frames in flight, a partition pending, the stream read.
    let mut original = switch_with(KEY, lossy());
    for i in 0..30u32 {
        let now = VirtNanos::from_micros(20 * u64::from(i));
        original.due(now);
        let (from, to) = [(A, MAC_B), (B, BROADCAST_MAC), (C, MAC_A)][i as usize % 3];
        original.submit(now, from, frame(to, from, i)).unwrap();
    }
    original
        .partition(VirtNanos::from_micros(700), vec![vec![A], vec![B, C]])
        .unwrap();
    original.heal(VirtNanos::from_micros(900)).unwrap();
    let saved = original.save();
    let json = serde_json::to_string(&saved).unwrap();
    assert!(saved.in_flight.len() > 3);

    // Act
    let mut restored = Switch::from_state(&serde_json::from_str(&json).unwrap());
    let restored_state = restored.save();
    let continue_run = |switch: &mut Switch| {
        let mut schedule = Vec::new();
        for i in 30..60u32 {
            let now = VirtNanos::from_micros(20 * u64::from(i));
            schedule.extend(switch.due(now).into_iter().map(|(p, f)| (now, p, tag(&f))));
            let (from, to) = [(A, MAC_C), (B, MAC_A), (C, BROADCAST_MAC)][i as usize % 3];
            switch.submit(now, from, frame(to, from, i)).unwrap();
        }
        schedule.extend(drain(switch));
        schedule
    };
    let original_schedule = continue_run(&mut original);
    let restored_schedule = continue_run(&mut restored);

    // Assert
    assert_eq!(restored_state, saved);
    assert_eq!(restored_schedule, original_schedule);
    assert_eq!(restored.save(), original.save());
    let early: Vec<u32> = original_schedule
        .iter()
        .filter(|&&(_, _, t)| t < 30)
        .map(|&(_, _, t)| t)
        .collect();
    assert!(!early.is_empty(), "no frame in flight at the save arrived");
}

#[test]
fn test_switch_probabilities_round_trip_exactly_through_json() {
    // Arrange
    let mut config = fixed(MICROS_100);
    config.loss = 0.1 + 0.2;
    config.duplicate = 1e-300;
    config.reorder = 0.123_456_789_012_345_67;

    // Act
    let json = serde_json::to_string(&config).unwrap();
    let back: NetworkConfig = serde_json::from_str(&json).unwrap();
    let from_numbers: NetworkConfig = serde_json::from_str(
        r#"{"latency":{"Fixed":5},"loss":0.25,"duplicate":0,"reorder":1,
            "reorder_delay":{"Fixed":0}}"#,
    )
    .unwrap();

    // Assert
    assert!(json.contains(r#""loss":"0.30000000000000004""#), "{json}");
    assert_eq!(back.loss.to_bits(), config.loss.to_bits());
    assert_eq!(back, config);
    assert_eq!(
        (
            from_numbers.loss,
            from_numbers.duplicate,
            from_numbers.reorder
        ),
        (0.25, 0.0, 1.0)
    );
}

#[test]
fn test_switch_from_state_is_total_on_hand_written_states() {
    // Arrange: bounds reversed, 0 terms, a probability above 1, and a
    // sequence counter behind the frames in flight.
    let mut switch = switch_with(KEY, fixed(MICROS_100));
    switch.submit(VirtNanos(0), A, frame(MAC_B, A, 1)).unwrap();
    let mut state = switch.save();
    state.config = NetworkConfig {
        latency: LatencyDist::Normal {
            min: VirtNanos(9),
            max: VirtNanos(3),
            terms: 0,
        },
        loss: 0.0,
        duplicate: 2.0,
        reorder: f64::NAN,
        reorder_delay: LatencyDist::Uniform {
            min: VirtNanos(5),
            max: VirtNanos(1),
        },
    };
    state.next_seq = 0;
    state.link_floors.clear();

    // Act
    let mut restored = Switch::from_state(&state);
    restored
        .submit(VirtNanos(10), A, frame(MAC_B, A, 2))
        .unwrap();
    let deadline = restored.next_deadline().unwrap();
    let delivered = restored.due(VirtNanos::from_secs(1));

    // Assert: two copies of the new frame 3..=9 ns after it was sent,
    // then the old frame, which a colliding sequence did not overwrite.
    assert!((13..=19).contains(&deadline.0), "{deadline}");
    let tags: Vec<u32> = delivered.iter().map(|(_, f)| tag(f)).collect();
    assert_eq!(tags, [2, 2, 1]);
    assert_eq!(restored.save().next_seq, 3);
}

/// Frames in flight, a partition and a heal scheduled, the stream read.
fn busy_switch() -> Switch {
    let mut switch = switch_with(KEY, lossy());
    for i in 0..10u32 {
        let now = VirtNanos::from_micros(20 * u64::from(i));
        switch.due(now);
        let (from, to) = [(A, MAC_B), (B, BROADCAST_MAC), (C, MAC_A)][i as usize % 3];
        switch.submit(now, from, frame(to, from, i)).unwrap();
    }
    switch
        .partition(VirtNanos::from_micros(700), vec![vec![A], vec![B, C]])
        .unwrap();
    switch.heal(VirtNanos::from_micros(900)).unwrap();
    switch
}

crate::persist::persist_round_trip_tests! {
    mod switch_persist {
        fresh: switch_with([0; 32], fixed(MICROS_100)),
        saved: busy_switch(),
        mutate: |switch: &mut Switch| {
            drain(switch);
        },
    }
}

#[test]
fn test_switch_rekey_changes_later_draws_and_repeats_per_key() {
    let jittery = NetworkConfig {
        latency: LatencyDist::Uniform {
            min: VirtNanos::from_micros(1),
            max: VirtNanos::from_micros(40_000),
        },
        ..fixed(VirtNanos::ZERO)
    };
    let delays = |key: Option<[u8; 32]>| {
        let mut switch = switch_with(KEY, jittery);
        if let Some(key) = key {
            switch.rekey(key);
        }
        (0..10u32)
            .map(|i| {
                let now = VirtNanos::from_secs(u64::from(i));
                switch.submit(now, A, frame(MAC_B, A, i)).unwrap();
                let deadline = switch.next_deadline().unwrap();
                switch.due(deadline);
                deadline - now
            })
            .collect::<Vec<_>>()
    };
    assert_ne!(delays(None), delays(Some(OTHER_KEY)));
    assert_eq!(delays(Some(OTHER_KEY)), delays(Some(OTHER_KEY)));
    // Re-keyed with the key it had, the switch starts its stream over.
    assert_eq!(delays(Some(KEY)), delays(None));
}

#[test]
fn test_frames_in_flight_are_bounded_and_the_drops_counted() {
    let mut switch = switch_with(KEY, fixed(VirtNanos::from_micros(10_000)));
    // From A to B and C: two copies a frame.
    let sent = MAX_IN_FLIGHT / 2 + 10;
    for i in 0..sent {
        switch
            .submit(VirtNanos::ZERO, A, frame([0xff; 6], A, i as u32))
            .unwrap();
    }
    assert_eq!(switch.in_flight_len(), MAX_IN_FLIGHT);
    let counters = switch.counters(A).unwrap();
    assert_eq!(counters.dropped_full, 20);
    // The first frames got through; the last ones were dropped, by count.
    let delivered = drain(&mut switch);
    assert_eq!(delivered.len(), MAX_IN_FLIGHT);
    assert_eq!(delivered.last().unwrap().2, (MAX_IN_FLIGHT / 2 - 1) as u32);
    // Once delivered, frames flow again.
    switch
        .submit(VirtNanos::from_micros(20_000), A, frame(MAC_B, A, 7))
        .unwrap();
    assert_eq!(switch.in_flight_len(), 1);
    // A state without such drops is saved as before (no new field).
    let quiet = switch_with(KEY, fixed(VirtNanos::from_micros(10_000)));
    let text = serde_json::to_string(&quiet.save()).unwrap();
    assert!(!text.contains("dropped_full"), "{text}");
}

#[test]
fn test_a_latency_beyond_the_largest_is_refused() {
    let hours = LatencyDist::Fixed(VirtNanos::from_secs(100_000 * 3600));
    let e = Switch::new(KEY, NetworkConfig::reliable(hours)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid network configuration: latency 360000000s is above the largest, 60s"
    );
    let range = LatencyDist::Uniform {
        min: VirtNanos::ZERO,
        max: VirtNanos(MAX_LATENCY.0 + 1),
    };
    assert!(range.validate().is_err());
    LatencyDist::Fixed(MAX_LATENCY).validate().unwrap();
}
